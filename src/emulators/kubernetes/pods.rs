//! The emulator's pods: their API objects, the resource versions and watch events, and the
//! Docker container behind each (created from the pod's first container, its ports published
//! on the pod's own loopback address so that `podIP:port` answers from this host as a pod IP
//! answers inside a cluster).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use bollard::Docker;
use bollard::models::{ContainerCreateBody, HostConfig, PortBinding};
use bollard::query_parameters::{
    CreateContainerOptions, InspectContainerOptions, ListContainersOptions, RemoveContainerOptions,
};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use super::documents::{Selector, pod_field, status, timestamp};

/// Label on every container of an emulator: the emulator instance.
pub const LABEL_INSTANCE: &str = "rakazo.kubernetes-emulator";
/// Label on every container of an emulator: the emulator's process id (for cleaning up after
/// one that was killed).
pub const LABEL_PID: &str = "rakazo.kubernetes-emulator.pid";
/// The one seccomp profile this node has installed (under the kubelet's seccomp root).
pub const SECCOMP_PROFILE_NAME: &str = "profiles/rakazo-computer.json";
/// The node every pod is scheduled on.
pub const NODE: &str = "rakazo-emulator-node";

/// A watch event.
#[derive(Clone, Debug)]
pub struct Event {
    /// `ADDED`, `MODIFIED` or `DELETED`.
    pub kind: &'static str,
    /// The pod after the change.
    pub pod: Value,
}

struct Entry {
    pod: Value,
    container: Option<String>,
}

#[derive(Default)]
struct State {
    rv: u64,
    pods: BTreeMap<(String, String), Entry>,
}

/// An API error: HTTP status and its `metav1.Status` body.
pub type ApiError = (u16, Value);

fn not_found(name: &str) -> ApiError {
    (
        404,
        status(404, "NotFound", &format!("pods \"{name}\" not found")),
    )
}

/// The pods of one emulator.
pub struct Pods {
    docker: Docker,
    instance: String,
    /// Claim name to the host directory of its volume.
    claims: HashMap<String, std::path::PathBuf>,
    state: Mutex<State>,
    events: broadcast::Sender<Event>,
}

impl Pods {
    /// Pods backed by the local Docker engine; containers that an emulator which is no longer
    /// running left behind are removed first.
    pub async fn connect(
        claims: HashMap<String, std::path::PathBuf>,
    ) -> Result<Self, bollard::errors::Error> {
        let docker = Docker::connect_with_unix_defaults()?
            .negotiate_version()
            .await?;
        let pods = Self {
            docker,
            instance: uuid::Uuid::new_v4().simple().to_string(),
            claims,
            state: Mutex::new(State::default()),
            events: broadcast::channel(1024).0,
        };
        pods.remove_orphans().await;
        Ok(pods)
    }

    async fn remove_orphans(&self) {
        let mut filters = HashMap::new();
        filters.insert("label".to_string(), vec![LABEL_PID.to_string()]);
        let Ok(list) = self
            .docker
            .list_containers(Some(ListContainersOptions {
                all: true,
                filters: Some(filters),
                ..Default::default()
            }))
            .await
        else {
            return;
        };
        for c in list {
            let pid = c
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_PID))
                .and_then(|p| p.parse::<u32>().ok());
            let alive = pid.is_some_and(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
            if !alive && let Some(id) = c.id {
                self.remove_container(&id).await;
            }
        }
    }

    async fn remove_container(&self, id: &str) {
        let _ = self
            .docker
            .remove_container(
                id,
                Some(RemoveContainerOptions {
                    force: true,
                    v: true,
                    ..Default::default()
                }),
            )
            .await;
    }

    /// Removes every container of this emulator (at shutdown).
    pub async fn remove_all(&self) {
        let ids: Vec<String> = {
            let mut state = self.state.lock().unwrap();
            let ids = state
                .pods
                .values()
                .filter_map(|e| e.container.clone())
                .collect();
            state.pods.clear();
            ids
        };
        for id in ids {
            self.remove_container(&id).await;
        }
    }

    /// New watchers see every change from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Event> {
        self.events.subscribe()
    }

    /// Stamps `pod` with the next resource version and tells the watchers.
    fn publish(
        state: &mut State,
        events: &broadcast::Sender<Event>,
        kind: &'static str,
        pod: &mut Value,
    ) {
        state.rv += 1;
        pod["metadata"]["resourceVersion"] = json!(state.rv.to_string());
        let _ = events.send(Event {
            kind,
            pod: pod.clone(),
        });
    }

    /// The current resource version.
    pub fn resource_version(&self) -> String {
        self.state.lock().unwrap().rv.to_string()
    }

    /// One pod.
    pub fn get(&self, ns: &str, name: &str) -> Result<Value, ApiError> {
        let state = self.state.lock().unwrap();
        state
            .pods
            .get(&(ns.to_owned(), name.to_owned()))
            .map(|e| e.pod.clone())
            .ok_or_else(|| not_found(name))
    }

    /// The pods of `ns` (all namespaces for `None`) that both selectors select, and the
    /// resource version of the list.
    pub fn list(
        &self,
        ns: Option<&str>,
        labels: &Selector,
        fields: &Selector,
    ) -> (String, Vec<Value>) {
        let state = self.state.lock().unwrap();
        let items = state
            .pods
            .iter()
            .filter(|((n, _), _)| ns.is_none_or(|ns| ns == n))
            .map(|(_, e)| &e.pod)
            .filter(|pod| selects(pod, labels, fields))
            .cloned()
            .collect();
        (state.rv.to_string(), items)
    }

    /// Creates a pod from the client's object and starts its container in the background.
    pub fn create(
        self: &std::sync::Arc<Self>,
        ns: &str,
        mut pod: Value,
    ) -> Result<Value, ApiError> {
        let invalid = |why: &str| (422, status(422, "Invalid", why));
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        if !is_dns_label(&name) {
            return Err(invalid(&format!(
                "Pod \"{name}\" is invalid: metadata.name: Invalid value: a lowercase RFC 1123 subdomain is required"
            )));
        }
        if let Some(other) = pod["metadata"]["namespace"].as_str()
            && other != ns
        {
            return Err((
                400,
                status(
                    400,
                    "BadRequest",
                    "the namespace of the provided object does not match the namespace sent on the request",
                ),
            ));
        }
        let image_given = pod["spec"]["containers"]
            .as_array()
            .and_then(|c| c.first())
            .and_then(|c| c["image"].as_str())
            .is_some_and(|i| !i.is_empty());
        if !image_given {
            return Err(invalid(&format!(
                "Pod \"{name}\" is invalid: spec.containers[0].image: Required value"
            )));
        }
        let now = timestamp(SystemTime::now());
        let uid = uuid::Uuid::new_v4().to_string();
        pod["apiVersion"] = json!("v1");
        pod["kind"] = json!("Pod");
        let meta = &mut pod["metadata"];
        meta["namespace"] = json!(ns);
        meta["uid"] = json!(uid);
        meta["creationTimestamp"] = json!(now);
        meta["generation"] = json!(1);
        if let Some(m) = meta.as_object_mut() {
            m.remove("deletionTimestamp");
        }
        let key = (ns.to_owned(), name.clone());
        {
            let mut state = self.state.lock().unwrap();
            let unschedulable = self.unschedulable(&state, ns, &pod);
            match &unschedulable {
                None => {
                    pod["spec"]["nodeName"] = json!(NODE);
                    pod["status"] = json!({
                        "phase": "Pending",
                        "qosClass": "Burstable",
                        "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now}]
                    });
                }
                Some(message) => {
                    // As the scheduler leaves it: pending, never started (not retried here).
                    pod["status"] = json!({
                        "phase": "Pending",
                        "qosClass": "Burstable",
                        "conditions": [{
                            "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                            "message": message, "lastTransitionTime": now
                        }]
                    });
                }
            }
            if state.pods.contains_key(&key) {
                return Err((
                    409,
                    status(
                        409,
                        "AlreadyExists",
                        &format!("pods \"{name}\" already exists"),
                    ),
                ));
            }
            Self::publish(&mut state, &self.events, "ADDED", &mut pod);
            state.pods.insert(
                key.clone(),
                Entry {
                    pod: pod.clone(),
                    container: None,
                },
            );
        }
        if pod["spec"]["nodeName"] == json!(NODE) {
            let me = self.clone();
            let spec = pod.clone();
            tokio::spawn(async move { me.start(key, uid, spec).await });
        }
        Ok(pod)
    }

    /// Why the scheduler would leave `pod` pending on this one node: a claim it mounts that
    /// this node does not have, or a required pod affinity no pod of the node matches.
    fn unschedulable(&self, state: &State, ns: &str, pod: &Value) -> Option<String> {
        for v in pod["spec"]["volumes"].as_array().into_iter().flatten() {
            if let Some(claim) = v["persistentVolumeClaim"]["claimName"].as_str()
                && !self.claims.contains_key(claim)
            {
                return Some(format!(
                    "0/1 nodes are available: persistentvolumeclaim \"{claim}\" not found."
                ));
            }
        }
        let terms = &pod["spec"]["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
        for term in terms.as_array().into_iter().flatten() {
            let namespaces: Vec<&str> = match term["namespaces"].as_array() {
                Some(list) if !list.is_empty() => list.iter().filter_map(Value::as_str).collect(),
                _ => vec![ns],
            };
            let wanted = term["labelSelector"]["matchLabels"]
                .as_object()
                .cloned()
                .unwrap_or_default();
            let matched = state.pods.iter().any(|((pod_ns, _), e)| {
                namespaces.contains(&pod_ns.as_str())
                    && e.pod["metadata"]["deletionTimestamp"].is_null()
                    && e.pod["spec"]["nodeName"] == json!(NODE)
                    && wanted
                        .iter()
                        .all(|(k, v)| &e.pod["metadata"]["labels"][k] == v)
            });
            if !matched {
                return Some(
                    "0/1 nodes are available: 1 node(s) didn't match pod affinity rules.".into(),
                );
            }
        }
        None
    }

    /// The binds of the pod's claim mounts (`host dir[/subPath]:mountPath`), each sub-path
    /// created as the kubelet does, and never through a link.
    fn claim_binds(&self, pod: &Value, c: &Value) -> Result<Vec<String>, String> {
        let mut binds = Vec::new();
        for m in c["volumeMounts"].as_array().into_iter().flatten() {
            let name = m["name"].as_str().unwrap_or_default();
            let volume = pod["spec"]["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|v| v["name"].as_str() == Some(name));
            let Some(claim) = volume.and_then(|v| v["persistentVolumeClaim"]["claimName"].as_str())
            else {
                return Err(format!("volume {name:?} is not a claim this node serves"));
            };
            let Some(root) = self.claims.get(claim) else {
                return Err(format!("persistentvolumeclaim {claim:?} not found"));
            };
            let target = m["mountPath"].as_str().unwrap_or_default();
            if !target.starts_with('/') || target.contains(':') {
                return Err(format!("mountPath {target:?} is not an absolute path"));
            }
            let mut source = root.clone();
            if let Some(sub) = m["subPath"].as_str().filter(|s| !s.is_empty()) {
                if sub.starts_with('/') || sub.split('/').any(|p| p == "..") || sub.contains(':') {
                    return Err(format!(
                        "subPath {sub:?} must be a relative path without '..'"
                    ));
                }
                for part in sub.split('/').filter(|p| !p.is_empty() && *p != ".") {
                    source.push(part);
                    match std::fs::symlink_metadata(&source) {
                        Ok(meta) if meta.is_dir() => {}
                        Ok(_) => return Err(format!("subPath {sub:?} is not a directory")),
                        Err(_) => std::fs::create_dir(&source)
                            .map_err(|e| format!("subPath {sub:?}: {}", e.kind()))?,
                    }
                }
            }
            binds.push(format!("{}:{target}", source.display()));
        }
        Ok(binds)
    }

    fn pod_ip(&self) -> String {
        use rand::Rng as _;
        let taken: Vec<String> = self
            .state
            .lock()
            .unwrap()
            .pods
            .values()
            .filter_map(|e| e.pod["status"]["podIP"].as_str().map(str::to_owned))
            .collect();
        let mut rng = rand::rng();
        loop {
            let ip = format!(
                "127.{}.{}.{}",
                rng.random_range(100..=199u8),
                rng.random_range(1..=254u8),
                rng.random_range(1..=254u8)
            );
            if !taken.contains(&ip) {
                return ip;
            }
        }
    }

    /// Creates and starts the pod's container, then records what came of it.
    async fn start(&self, key: (String, String), uid: String, pod: Value) {
        let ip = self.pod_ip();
        let result = self.run_container(&key, &uid, &pod, &ip).await;
        let now = timestamp(SystemTime::now());
        let mut state = self.state.lock().unwrap();
        let State { pods, .. } = &mut *state;
        let Some(entry) = pods
            .get_mut(&key)
            .filter(|e| e.pod["metadata"]["uid"] == json!(uid))
        else {
            // Deleted while starting.
            drop(state);
            if let Ok(id) = result {
                let id = id.clone();
                let docker = self.docker.clone();
                tokio::spawn(async move {
                    let _ = docker
                        .remove_container(
                            &id,
                            Some(RemoveContainerOptions {
                                force: true,
                                v: true,
                                ..Default::default()
                            }),
                        )
                        .await;
                });
            }
            return;
        };
        let c = &pod["spec"]["containers"][0];
        let cname = c["name"].as_str().unwrap_or("main");
        let image = c["image"].as_str().unwrap_or_default();
        match result {
            Ok(id) => {
                entry.container = Some(id.clone());
                entry.pod["status"] = json!({
                    "phase": "Running",
                    "podIP": ip,
                    "podIPs": [{"ip": ip}],
                    "hostIP": "127.0.0.1",
                    "hostIPs": [{"ip": "127.0.0.1"}],
                    "startTime": now,
                    "qosClass": "Burstable",
                    "conditions": [
                        {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": now},
                        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                        {"type": "Ready", "status": "True", "lastTransitionTime": now},
                        {"type": "ContainersReady", "status": "True", "lastTransitionTime": now},
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}
                    ],
                    "containerStatuses": [{
                        "name": cname, "image": image, "imageID": format!("docker-pullable://{image}"),
                        "containerID": format!("docker://{id}"),
                        "ready": true, "started": true, "restartCount": 0,
                        "state": {"running": {"startedAt": now}}
                    }]
                });
            }
            Err((reason, message)) => {
                tracing::info!(reason, "kubernetes_emulator.pod.not_started");
                entry.pod["status"]["containerStatuses"] = json!([{
                    "name": cname, "image": image, "imageID": "",
                    "ready": false, "started": false, "restartCount": 0,
                    "state": {"waiting": {"reason": reason, "message": message}}
                }]);
            }
        }
        let mut pod = entry.pod.clone();
        state.rv += 1;
        pod["metadata"]["resourceVersion"] = json!(state.rv.to_string());
        if let Some(e) = state.pods.get_mut(&key) {
            e.pod = pod.clone();
        }
        let _ = self.events.send(Event {
            kind: "MODIFIED",
            pod,
        });
    }

    async fn run_container(
        &self,
        key: &(String, String),
        uid: &str,
        pod: &Value,
        ip: &str,
    ) -> Result<String, (&'static str, String)> {
        let c = &pod["spec"]["containers"][0];
        let image = c["image"].as_str().unwrap_or_default().to_owned();
        if self.docker.inspect_image(&image).await.is_err() {
            return Err((
                "ErrImagePull",
                format!("image {image:?} is not on this node (no image is pulled)"),
            ));
        }
        let strings = |v: &Value| -> Option<Vec<String>> {
            v.as_array().map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(str::to_owned))
                    .collect()
            })
        };
        let env: Vec<String> = c["env"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| {
                        Some(format!(
                            "{}={}",
                            e["name"].as_str()?,
                            e["value"].as_str().unwrap_or("")
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let pod_sc = &pod["spec"]["securityContext"];
        let sc = &c["securityContext"];
        let pick = |k: &str| sc[k].as_i64().or_else(|| pod_sc[k].as_i64());
        let user = pick("runAsUser").map(|u| match pick("runAsGroup") {
            Some(g) => format!("{u}:{g}"),
            None => u.to_string(),
        });
        let ports: Vec<u16> = c["ports"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|p| p["protocol"].as_str().is_none_or(|p| p == "TCP"))
                    .filter_map(|p| {
                        p["containerPort"]
                            .as_u64()
                            .and_then(|p| u16::try_from(p).ok())
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut bindings = HashMap::new();
        for port in &ports {
            bindings.insert(
                format!("{port}/tcp"),
                Some(vec![PortBinding {
                    host_ip: Some(ip.to_owned()),
                    host_port: Some(port.to_string()),
                }]),
            );
        }
        let limits = &c["resources"]["limits"];
        let memory = limits["memory"].as_str().and_then(memory_bytes);
        let nano_cpus = limits["cpu"].as_str().and_then(cpu_nanos);
        let cap_drop = strings(&sc["capabilities"]["drop"]);
        let binds = self
            .claim_binds(pod, c)
            .map_err(|e| ("CreateContainerConfigError", e))?;
        // The kubelet adds the pod's fsGroup to the container's groups.
        let group_add = pod_sc["fsGroup"].as_i64().map(|g| vec![g.to_string()]);
        let mut security_opt = Vec::new();
        if sc["allowPrivilegeEscalation"] == json!(false) {
            security_opt.push("no-new-privileges:true".to_owned());
        }
        // This node has one seccomp profile installed: the computers' own.
        let seccomp = if sc["seccompProfile"].is_object() {
            &sc["seccompProfile"]
        } else {
            &pod_sc["seccompProfile"]
        };
        match (
            seccomp["type"].as_str(),
            seccomp["localhostProfile"].as_str(),
        ) {
            (Some("Unconfined"), _) => security_opt.push("seccomp=unconfined".to_owned()),
            (Some("Localhost"), Some(SECCOMP_PROFILE_NAME)) => security_opt.push(format!(
                "seccomp={}",
                crate::supervisor::engine::SECCOMP_PROFILE
            )),
            (Some("Localhost"), other) => {
                return Err((
                    "CreateContainerError",
                    format!("seccomp profile {other:?} is not installed on this node"),
                ));
            }
            _ => {}
        }
        let mut labels = HashMap::new();
        labels.insert(LABEL_INSTANCE.to_owned(), self.instance.clone());
        labels.insert(LABEL_PID.to_owned(), std::process::id().to_string());
        labels.insert("io.kubernetes.pod.namespace".to_owned(), key.0.clone());
        labels.insert("io.kubernetes.pod.name".to_owned(), key.1.clone());
        labels.insert("io.kubernetes.pod.uid".to_owned(), uid.to_owned());
        let (entrypoint, cmd) = match (strings(&c["command"]), strings(&c["args"])) {
            (Some(command), args) => (Some(command), Some(args.unwrap_or_default())),
            (None, args) => (None, args),
        };
        let body = ContainerCreateBody {
            image: Some(image),
            entrypoint,
            cmd,
            env: Some(env),
            user,
            working_dir: c["workingDir"].as_str().map(str::to_owned),
            hostname: Some(key.1.chars().take(63).collect()),
            labels: Some(labels),
            exposed_ports: Some(ports.iter().map(|p| format!("{p}/tcp")).collect()),
            host_config: Some(HostConfig {
                port_bindings: Some(bindings),
                memory,
                nano_cpus,
                cap_drop,
                binds: Some(binds),
                group_add,
                security_opt: Some(security_opt),
                ..Default::default()
            }),
            ..Default::default()
        };
        let name = format!("k8s-emu-{}-{}-{}", key.0, key.1, &uid[..8]);
        let fail = |e: bollard::errors::Error| ("CreateContainerError", e.to_string());
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(name),
                    ..Default::default()
                }),
                body,
            )
            .await
            .map_err(fail)?;
        if let Err(e) = self.docker.start_container(&created.id, None).await {
            self.remove_container(&created.id).await;
            return Err(("RunContainerError", e.to_string()));
        }
        Ok(created.id)
    }

    /// Deletes a pod: marked with its deletion time at once, gone when its container is.
    pub fn delete(self: &std::sync::Arc<Self>, ns: &str, name: &str) -> Result<Value, ApiError> {
        let key = (ns.to_owned(), name.to_owned());
        let (pod, container, uid) = {
            let mut state = self.state.lock().unwrap();
            let State { pods, .. } = &mut *state;
            let entry = pods.get_mut(&key).ok_or_else(|| not_found(name))?;
            if entry.pod["metadata"]["deletionTimestamp"].is_string() {
                return Ok(entry.pod.clone());
            }
            let mut pod = entry.pod.clone();
            pod["metadata"]["deletionTimestamp"] = json!(timestamp(SystemTime::now()));
            pod["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            let container = entry.container.clone();
            Self::publish(&mut state, &self.events, "MODIFIED", &mut pod);
            if let Some(e) = state.pods.get_mut(&key) {
                e.pod = pod.clone();
            }
            let uid = pod["metadata"]["uid"].clone();
            (pod, container, uid)
        };
        let me = self.clone();
        tokio::spawn(async move {
            if let Some(id) = container {
                me.remove_container(&id).await;
            }
            me.forget(&key, &uid);
        });
        Ok(pod)
    }

    /// Drops the pod `key` (if it is still the one with `uid`) and tells the watchers.
    fn forget(&self, key: &(String, String), uid: &Value) {
        let mut state = self.state.lock().unwrap();
        if state
            .pods
            .get(key)
            .is_some_and(|e| &e.pod["metadata"]["uid"] == uid)
            && let Some(mut entry) = state.pods.remove(key)
        {
            Self::publish(&mut state, &self.events, "DELETED", &mut entry.pod);
        }
    }

    /// The container of a running pod and the name of its first container, for exec.
    pub fn container(
        &self,
        ns: &str,
        name: &str,
        wanted: Option<&str>,
    ) -> Result<String, ApiError> {
        let state = self.state.lock().unwrap();
        let entry = state
            .pods
            .get(&(ns.to_owned(), name.to_owned()))
            .ok_or_else(|| not_found(name))?;
        if let Some(wanted) = wanted {
            let known = entry.pod["spec"]["containers"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["name"] == json!(wanted)));
            if !known {
                return Err((
                    400,
                    status(
                        400,
                        "BadRequest",
                        &format!("container {wanted} is not valid for pod {name}"),
                    ),
                ));
            }
        }
        // Pods are deleted with no grace period here: a terminating pod runs nothing more.
        let terminating = entry.pod["metadata"]["deletionTimestamp"].is_string();
        match (&entry.container, entry.pod["status"]["phase"].as_str()) {
            (Some(id), Some("Running")) if !terminating => Ok(id.clone()),
            _ => Err((
                400,
                status(
                    400,
                    "BadRequest",
                    &format!("unable to upgrade connection: container not found (\"{name}\")"),
                ),
            )),
        }
    }

    /// The Docker engine, for exec.
    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    /// Follows the containers: a removed container takes its pod with it (as an evicted or
    /// deleted pod is gone), a stopped one ends its pod's phase.
    pub async fn follow(self: std::sync::Arc<Self>) {
        loop {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let running: Vec<((String, String), String, Value)> = {
                let state = self.state.lock().unwrap();
                state
                    .pods
                    .iter()
                    .filter(|(_, e)| e.pod["status"]["phase"] == json!("Running"))
                    .filter_map(|(k, e)| {
                        Some((
                            k.clone(),
                            e.container.clone()?,
                            e.pod["metadata"]["uid"].clone(),
                        ))
                    })
                    .collect()
            };
            for (key, id, uid) in running {
                match self
                    .docker
                    .inspect_container(&id, None::<InspectContainerOptions>)
                    .await
                {
                    Err(bollard::errors::Error::DockerResponseServerError {
                        status_code: 404,
                        ..
                    }) => {
                        self.forget(&key, &uid);
                    }
                    Ok(info) => {
                        let st = info.state.unwrap_or_default();
                        if st.running == Some(true) {
                            continue;
                        }
                        let code = st.exit_code.unwrap_or(-1);
                        let now = timestamp(SystemTime::now());
                        let mut state = self.state.lock().unwrap();
                        let State { pods, .. } = &mut *state;
                        let Some(entry) = pods
                            .get_mut(&key)
                            .filter(|e| e.pod["metadata"]["uid"] == uid)
                        else {
                            continue;
                        };
                        let mut pod = entry.pod.clone();
                        pod["status"]["phase"] =
                            json!(if code == 0 { "Succeeded" } else { "Failed" });
                        if let Some(conds) = pod["status"]["conditions"].as_array_mut() {
                            for c in conds.iter_mut() {
                                if c["type"] == json!("Ready")
                                    || c["type"] == json!("ContainersReady")
                                {
                                    c["status"] = json!("False");
                                    c["lastTransitionTime"] = json!(now);
                                }
                            }
                        }
                        pod["status"]["containerStatuses"][0]["ready"] = json!(false);
                        pod["status"]["containerStatuses"][0]["state"] =
                            json!({"terminated": {"exitCode": code, "finishedAt": now}});
                        Self::publish(&mut state, &self.events, "MODIFIED", &mut pod);
                        if let Some(e) = state.pods.get_mut(&key) {
                            e.pod = pod;
                        }
                    }
                    Err(_) => {}
                }
            }
        }
    }
}

/// Whether `pod` is selected by both selectors.
pub fn selects(pod: &Value, labels: &Selector, fields: &Selector) -> bool {
    labels.matches(|k| pod["metadata"]["labels"][k].as_str().map(str::to_owned))
        && fields.matches(|k| pod_field(pod, k))
}

/// RFC 1123 label rules for a pod name (the subdomain form, without dots here).
fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name.as_bytes()[name.len() - 1].is_ascii_alphanumeric()
}

/// A memory quantity in bytes (`4Gi`, `512M`, `1000`).
pub fn memory_bytes(q: &str) -> Option<i64> {
    let digits = q.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let n: f64 = digits.parse().ok()?;
    let mult: f64 = match &q[digits.len()..] {
        "" => 1.0,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0f64.powi(4),
        _ => return None,
    };
    Some((n * mult) as i64)
}

/// A CPU quantity in billionths of a CPU (`500m`, `2`, `1.5`).
pub fn cpu_nanos(q: &str) -> Option<i64> {
    match q.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().ok().map(|m| (m * 1e6) as i64),
        None => q.parse::<f64>().ok().map(|c| (c * 1e9) as i64),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities() {
        assert_eq!(memory_bytes("4Gi"), Some(4 << 30));
        assert_eq!(memory_bytes("512M"), Some(512_000_000));
        assert_eq!(cpu_nanos("500m"), Some(500_000_000));
        assert_eq!(cpu_nanos("2"), Some(2_000_000_000));
        assert!(is_dns_label("rakazo-abc") && !is_dns_label("Bad_Name") && !is_dns_label("-x"));
    }
}
