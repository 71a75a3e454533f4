//! The fixed documents of the Kubernetes API emulator (version, discovery, OpenAPI), the
//! `metav1.Status` bodies of its errors, selectors, query strings and timestamps.

use serde_json::{Value, json};

/// The server version kubectl's dispatcher picks its bundled kubectl by (minor 32: exec over
/// WebSockets).
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.4",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2026-01-01T00:00:00Z",
        "goVersion": "go1.23.8",
        "compiler": "gc",
        "platform": "linux/amd64"
    })
}

/// `GET /api`.
pub fn api_versions(server: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server}]
    })
}

/// `GET /apis`: no groups beyond the core one.
pub fn api_groups() -> Value {
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": []})
}

/// `GET /api/v1`: the resources this server has.
pub fn core_resources() -> Value {
    json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {"name": "namespaces", "singularName": "namespace", "namespaced": false, "kind": "Namespace",
             "verbs": ["get", "list"], "shortNames": ["ns"]},
            {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
             "verbs": ["create", "delete", "get", "list", "watch", "patch", "update"],
             "shortNames": ["po"], "categories": ["all"]},
            {"name": "pods/exec", "singularName": "", "namespaced": true, "kind": "PodExecOptions",
             "verbs": ["create", "get"]},
            {"name": "pods/log", "singularName": "", "namespaced": true, "kind": "Pod", "verbs": ["get"]},
            {"name": "pods/status", "singularName": "", "namespaced": true, "kind": "Pod",
             "verbs": ["get", "patch", "update"]}
        ]
    })
}

/// `GET /openapi/v3`: where the core group's document is.
pub fn openapi_index() -> Value {
    json!({"paths": {"api/v1": {"serverRelativeURL": "/openapi/v3/api/v1?hash=rakazo-emulator-1"}}})
}

/// `GET /openapi/v3/api/v1`: enough for kubectl's field validation of a Pod (a `patch`
/// operation naming the Pod kind, with the `fieldValidation` parameter).
pub fn openapi_core() -> Value {
    let gvk = json!({"group": "", "version": "v1", "kind": "Pod"});
    let params = json!([
        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}}
    ]);
    json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.4"},
        "paths": {
            "/api/v1/namespaces/{namespace}/pods/{name}": {
                "get": {"operationId": "readCoreV1NamespacedPod", "x-kubernetes-action": "get",
                        "x-kubernetes-group-version-kind": gvk.clone(),
                        "responses": {"200": {"description": "OK"}}},
                "patch": {"operationId": "patchCoreV1NamespacedPod", "x-kubernetes-action": "patch",
                          "x-kubernetes-group-version-kind": gvk.clone(),
                          "parameters": params.clone(),
                          "responses": {"200": {"description": "OK"}}}
            },
            "/api/v1/namespaces/{namespace}/pods": {
                "post": {"operationId": "createCoreV1NamespacedPod", "x-kubernetes-action": "post",
                         "x-kubernetes-group-version-kind": gvk,
                         "parameters": params,
                         "responses": {"201": {"description": "Created"}}}
            }
        },
        "components": {"schemas": {
            "io.k8s.api.core.v1.Pod": {
                "type": "object",
                "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Pod"}],
                "properties": {
                    "apiVersion": {"type": "string"},
                    "kind": {"type": "string"},
                    "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                }
            }
        }}
    })
}

/// A `metav1.Status` failure.
pub fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code
    })
}

/// The status an exec ends with, on channel 3.
pub fn exec_status(exit_code: i64) -> Value {
    if exit_code == 0 {
        json!({"metadata": {}, "status": "Success"})
    } else {
        json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: error executing command, exit status {exit_code}"),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": exit_code.to_string()}]}
        })
    }
}

/// The pairs of a query string, percent-decoded, in order (keys may repeat: `command=`).
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                match u8::from_str_radix(hex, 16) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One requirement of a label selector (`k=v`, `k==v`, `k!=v`, `k`, `!k`).
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

/// A parsed label or field selector: every requirement must hold.
pub struct Selector(Vec<Requirement>);

impl Selector {
    /// Parses a selector; `None` for one this server does not understand (set-based forms).
    pub fn parse(text: &str) -> Option<Self> {
        let mut reqs = Vec::new();
        for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if part.contains(" in ") || part.contains(" notin ") || part.contains('(') {
                return None;
            }
            let req = if let Some((k, v)) = part.split_once("!=") {
                Requirement::NotEquals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once("==") {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some((k, v)) = part.split_once('=') {
                Requirement::Equals(k.trim().into(), v.trim().into())
            } else if let Some(k) = part.strip_prefix('!') {
                Requirement::Absent(k.trim().into())
            } else {
                Requirement::Exists(part.into())
            };
            reqs.push(req);
        }
        Some(Self(reqs))
    }

    /// Whether `lookup` (a key's value, if any) satisfies every requirement.
    pub fn matches(&self, lookup: impl Fn(&str) -> Option<String>) -> bool {
        self.0.iter().all(|r| match r {
            Requirement::Equals(k, v) => lookup(k).as_deref() == Some(v.as_str()),
            Requirement::NotEquals(k, v) => lookup(k).as_deref() != Some(v.as_str()),
            Requirement::Exists(k) => lookup(k).is_some(),
            Requirement::Absent(k) => lookup(k).is_none(),
        })
    }
}

/// The value a field selector names on a pod.
pub fn pod_field(pod: &Value, field: &str) -> Option<String> {
    let path: &[&str] = match field {
        "metadata.name" => &["metadata", "name"],
        "metadata.namespace" => &["metadata", "namespace"],
        "status.phase" => &["status", "phase"],
        "spec.nodeName" => &["spec", "nodeName"],
        _ => return None,
    };
    path.iter()
        .try_fold(pod, |v, k| v.get(k))
        .and_then(Value::as_str)
        .map(str::to_owned)
}

/// RFC 3339 time (seconds, UTC) of `t`, as Kubernetes writes timestamps.
pub fn timestamp(t: std::time::SystemTime) -> String {
    let secs = t
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_decode_and_keep_repeated_keys() {
        let pairs =
            query_pairs("command=sh&command=-c&command=echo+hi%21&container=main&stdin=true");
        assert_eq!(pairs[2], ("command".into(), "echo hi!".into()));
        assert_eq!(pairs.len(), 5);
        assert_eq!(query_pairs("a=%zz%4")[0].1, "%zz%4");
    }

    #[test]
    fn selectors_match_labels() {
        let labels = |k: &str| match k {
            "app" => Some("rakazo".to_owned()),
            _ => None,
        };
        assert!(Selector::parse("app=rakazo").unwrap().matches(labels));
        assert!(Selector::parse("app==rakazo,!bot").unwrap().matches(labels));
        assert!(!Selector::parse("app!=rakazo").unwrap().matches(labels));
        assert!(!Selector::parse("bot").unwrap().matches(labels));
        assert!(Selector::parse("app in (a,b)").is_none());
    }

    #[test]
    fn timestamps_are_rfc3339() {
        let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_796_093_268);
        assert_eq!(timestamp(t), "2026-12-01T02:47:48Z");
    }
}
