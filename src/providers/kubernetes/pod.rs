//! The pod of one kubernetes computer: its name, labels and security settings.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, EnvVar, PersistentVolumeClaimVolumeSource,
    Pod, PodAffinity, PodAffinityTerm, PodSecurityContext, PodSpec, ResourceRequirements,
    SeccompProfile, SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use rakazo_actors::provider::MachineSpec;
use sha2::Digest as _;

use crate::config::{HomeClaim, KubernetesSettings};
use crate::supervisor::engine::{GATEWAY_PORT, UID, WORKSPACE};

/// The name label every computer pod carries.
pub const LABEL_NAME: &str = "app.kubernetes.io/name";
/// Its value.
pub const APP: &str = "rakazo-computer";
/// The bot the computer belongs to (empty for a team computer).
pub const LABEL_BOT: &str = "rakazo-bot-id";
/// The workspace (space) of the computer.
pub const LABEL_WORKSPACE: &str = "rakazo-workspace-id";
/// The computer.
pub const LABEL_COMPUTER: &str = "rakazo-computer-id";
/// The container's name.
pub const CONTAINER: &str = "computer";
/// The seccomp profile of computer pods, installed on every node under the kubelet's seccomp
/// root (`config/computer-seccomp.json`: the runtime's default rules plus the user
/// namespaces Chromium's own sandbox needs).
pub const SECCOMP_PROFILE: &str = "profiles/rakazo-computer.json";

/// The volume of a mounted home.
pub const HOME_VOLUME: &str = "rakazo-home";

/// The pod's first process: a shell that reaps the orphans of detached desktop processes
/// (there is no init in the pod) and exits at SIGTERM.
const KEEPER: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

/// A fresh pod name for a computer: `rakazo-` and a digest of the computer id, then a random
/// suffix (a replacement never waits for its predecessor's name).
pub fn pod_name(computer_id: &str) -> String {
    let digest = hex::encode(&sha2::Sha256::digest(computer_id.as_bytes())[..6]);
    let suffix = &uuid::Uuid::new_v4().simple().to_string()[..6];
    format!("rakazo-{digest}-{suffix}")
}

/// `value` when it is a valid label value (63 characters of `[A-Za-z0-9._-]`, alphanumeric
/// at both ends), otherwise a digest of it: labels must never make a create fail.
pub fn label_value(value: &str) -> String {
    let valid = value.len() <= 63
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && value
            .bytes()
            .next()
            .is_none_or(|b| b.is_ascii_alphanumeric())
        && value
            .bytes()
            .last()
            .is_none_or(|b| b.is_ascii_alphanumeric());
    if valid {
        value.to_owned()
    } else {
        format!(
            "h-{}",
            hex::encode(&sha2::Sha256::digest(value.as_bytes())[..16])
        )
    }
}

/// The image of computer pods.
pub fn image(settings: &KubernetesSettings) -> String {
    settings
        .image
        .clone()
        .unwrap_or_else(crate::image::default_image)
}

/// Whether a pod mounts its home from the claim (rather than copying it).
pub fn mounts_home(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .is_some_and(|v| v.iter().any(|v| v.name == HOME_VOLUME))
}

/// The claim's sub-path of a home: `homes/<home key>`, for a home key that is one plain name.
pub fn home_sub_path(home_key: &str) -> Option<String> {
    let plain = !home_key.is_empty()
        && home_key.len() <= 128
        && home_key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !home_key.starts_with('.');
    plain.then(|| format!("homes/{home_key}"))
}

/// What a mounted home adds to a pod: the claim's volume at the workspace, `fsGroup: 1000`,
/// and a required affinity to the pods that hold the (ReadWriteOnce) volume.
fn mount_home(spec: &mut PodSpec, claim: &HomeClaim, sub_path: String) {
    spec.volumes = Some(vec![Volume {
        name: HOME_VOLUME.into(),
        persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
            claim_name: claim.claim.clone(),
            read_only: Some(false),
        }),
        ..Default::default()
    }]);
    for c in &mut spec.containers {
        c.volume_mounts = Some(vec![VolumeMount {
            name: HOME_VOLUME.into(),
            mount_path: WORKSPACE.into(),
            sub_path: Some(sub_path.clone()),
            ..Default::default()
        }]);
    }
    spec.security_context
        .get_or_insert_with(Default::default)
        .fs_group = Some(i64::from(UID));
    spec.affinity = Some(Affinity {
        pod_affinity: Some(PodAffinity {
            required_during_scheduling_ignored_during_execution: Some(vec![PodAffinityTerm {
                label_selector: Some(LabelSelector {
                    match_labels: Some(claim.colocate_labels.clone()),
                    ..Default::default()
                }),
                namespaces: Some(vec![claim.colocate_namespace.clone()]),
                topology_key: "kubernetes.io/hostname".into(),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    });
}

/// The pod of the computer `spec`, named `name`; with `home` (the claim, and the home key
/// checked by [`home_sub_path`]), the home is mounted from the claim.
pub fn computer_pod(
    name: &str,
    spec: &MachineSpec,
    settings: &KubernetesSettings,
    home: Option<(&HomeClaim, String)>,
) -> Pod {
    let mut labels = BTreeMap::new();
    labels.insert(LABEL_NAME.to_owned(), APP.to_owned());
    labels.insert(
        LABEL_BOT.to_owned(),
        label_value(spec.bot_id.as_deref().unwrap_or("")),
    );
    labels.insert(LABEL_WORKSPACE.to_owned(), label_value(&spec.space_id));
    labels.insert(LABEL_COMPUTER.to_owned(), label_value(&spec.computer_id));
    let quantities = |pairs: [(&str, &str); 2]| {
        let map: BTreeMap<String, Quantity> = pairs
            .into_iter()
            .filter(|(_, v)| !v.is_empty())
            .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
            .collect();
        (!map.is_empty()).then_some(map)
    };
    let uid = i64::from(UID);
    let mut pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(settings.namespace.clone()),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(PodSpec {
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            restart_policy: Some("Never".into()),
            termination_grace_period_seconds: Some(5),
            hostname: Some("computer".into()),
            security_context: Some(PodSecurityContext {
                run_as_user: Some(uid),
                run_as_group: Some(uid),
                run_as_non_root: Some(true),
                ..Default::default()
            }),
            containers: vec![Container {
                name: CONTAINER.into(),
                image: Some(image(settings)),
                image_pull_policy: Some("IfNotPresent".into()),
                command: Some(vec!["bash".into(), "-c".into(), KEEPER.into()]),
                working_dir: Some(WORKSPACE.into()),
                env: Some(vec![
                    EnvVar {
                        name: "HOME".into(),
                        value: Some(WORKSPACE.into()),
                        ..Default::default()
                    },
                    EnvVar {
                        name: "LANG".into(),
                        value: Some("C.UTF-8".into()),
                        ..Default::default()
                    },
                ]),
                ports: Some(vec![ContainerPort {
                    name: Some("gateway".into()),
                    container_port: i32::from(GATEWAY_PORT),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                resources: Some(ResourceRequirements {
                    requests: quantities([
                        ("cpu", settings.cpu_request.as_str()),
                        ("memory", settings.memory_request.as_str()),
                    ]),
                    limits: quantities([
                        ("cpu", settings.cpu_limit.as_str()),
                        ("memory", settings.memory_limit.as_str()),
                    ]),
                    ..Default::default()
                }),
                security_context: Some(SecurityContext {
                    run_as_user: Some(uid),
                    run_as_group: Some(uid),
                    run_as_non_root: Some(true),
                    allow_privilege_escalation: Some(false),
                    capabilities: Some(Capabilities {
                        drop: Some(vec!["ALL".into()]),
                        ..Default::default()
                    }),
                    seccomp_profile: Some(SeccompProfile {
                        type_: "Localhost".into(),
                        localhost_profile: Some(SECCOMP_PROFILE.into()),
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    };
    if let (Some((claim, sub_path)), Some(spec)) = (home, pod.spec.as_mut()) {
        mount_home(spec, claim, sub_path);
    }
    pod
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> KubernetesSettings {
        KubernetesSettings {
            namespace: "rakazo-sandboxes".into(),
            image: Some("registry.example/rakazo-computer:1.2".into()),
            cpu_request: "500m".into(),
            cpu_limit: "2".into(),
            memory_request: "1Gi".into(),
            memory_limit: "4Gi".into(),
            home_claim: None,
        }
    }

    #[test]
    fn the_pod_runs_as_uid_1000_without_token_or_service_links() {
        let spec = MachineSpec {
            computer_id: "c-1".into(),
            space_id: "space-1".into(),
            bot_id: Some("bot-7".into()),
            home_key: "home-1".into(),
        };
        let pod = computer_pod("rakazo-x", &spec, &settings(), None);
        let meta = &pod.metadata;
        assert_eq!(meta.namespace.as_deref(), Some("rakazo-sandboxes"));
        let labels = meta.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_NAME], "rakazo-computer");
        assert_eq!(labels[LABEL_BOT], "bot-7");
        assert_eq!(labels[LABEL_WORKSPACE], "space-1");
        let ps = pod.spec.as_ref().unwrap();
        assert_eq!(ps.automount_service_account_token, Some(false));
        assert_eq!(ps.enable_service_links, Some(false));
        let psc = ps.security_context.as_ref().unwrap();
        assert_eq!(
            (psc.run_as_user, psc.run_as_group),
            (Some(1000), Some(1000))
        );
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(ps.containers.len(), 1);
        let c = &ps.containers[0];
        assert_eq!(
            c.image.as_deref(),
            Some("registry.example/rakazo-computer:1.2")
        );
        let sc = c.security_context.as_ref().unwrap();
        assert_eq!(sc.run_as_user, Some(1000));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(
            sc.capabilities.as_ref().unwrap().drop.as_deref(),
            Some(&["ALL".to_string()][..])
        );
        let seccomp = sc.seccomp_profile.as_ref().unwrap();
        assert_eq!(seccomp.type_, "Localhost");
        assert_eq!(seccomp.localhost_profile.as_deref(), Some(SECCOMP_PROFILE));
        let res = c.resources.as_ref().unwrap();
        let requests = res.requests.as_ref().unwrap();
        let limits = res.limits.as_ref().unwrap();
        assert_eq!(requests["cpu"].0, "500m");
        assert_eq!(requests["memory"].0, "1Gi");
        assert_eq!(limits["cpu"].0, "2");
        assert_eq!(limits["memory"].0, "4Gi");
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 6080);
        // No environment of this process reaches the pod.
        let env: Vec<_> = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| e.name.as_str())
            .collect();
        assert_eq!(env, ["HOME", "LANG"]);
        // The JSON the API server receives says the same.
        let json = serde_json::to_value(&pod).unwrap();
        assert_eq!(json["spec"]["automountServiceAccountToken"], false);
        assert_eq!(json["spec"]["enableServiceLinks"], false);
        assert_eq!(json["spec"]["securityContext"]["runAsUser"], 1000);
    }

    #[test]
    fn a_team_computer_has_an_empty_bot_label_and_odd_ids_are_digested() {
        let spec = MachineSpec {
            computer_id: "c".into(),
            space_id: "a space/with spaces".into(),
            bot_id: None,
            home_key: "h".into(),
        };
        let mut s = settings();
        s.cpu_limit.clear();
        s.memory_request.clear();
        let pod = computer_pod("rakazo-y", &spec, &s, None);
        let labels = pod.metadata.labels.unwrap();
        assert_eq!(labels[LABEL_BOT], "");
        assert!(labels[LABEL_WORKSPACE].starts_with("h-"));
        assert_eq!(labels[LABEL_WORKSPACE].len(), 34);
        let res = pod.spec.unwrap().containers[0].resources.clone().unwrap();
        assert!(!res.limits.unwrap().contains_key("cpu"));
        assert!(!res.requests.unwrap().contains_key("memory"));
        let name = pod_name("computer-1");
        assert!(name.starts_with("rakazo-") && name.len() == 26, "{name}");
        assert_ne!(pod_name("computer-1"), name);
    }

    #[test]
    fn a_mounted_home_is_the_claims_sub_path_with_fs_group_and_affinity() {
        let spec = MachineSpec {
            computer_id: "c".into(),
            space_id: "s".into(),
            bot_id: None,
            home_key: "team-s".into(),
        };
        let claim = HomeClaim {
            claim: "rakazo-data".into(),
            colocate_namespace: "rakazo".into(),
            colocate_labels: [("app".to_string(), "rakazo-api".to_string())].into(),
        };
        let sub = home_sub_path(&spec.home_key).unwrap();
        let pod = computer_pod("rakazo-z", &spec, &settings(), Some((&claim, sub)));
        assert!(mounts_home(&pod));
        let json = serde_json::to_value(&pod).unwrap();
        let ps = &json["spec"];
        assert_eq!(ps["volumes"][0]["name"], HOME_VOLUME);
        assert_eq!(
            ps["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "rakazo-data"
        );
        let mount = &ps["containers"][0]["volumeMounts"][0];
        assert_eq!(mount["mountPath"], WORKSPACE);
        assert_eq!(mount["subPath"], "homes/team-s");
        assert_eq!(ps["securityContext"]["fsGroup"], 1000);
        assert_eq!(ps["securityContext"]["runAsUser"], 1000);
        let term =
            &ps["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
        assert_eq!(term["labelSelector"]["matchLabels"]["app"], "rakazo-api");
        assert_eq!(term["namespaces"][0], "rakazo");
        assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
        // Without a claim, nothing of it.
        let plain = computer_pod("rakazo-z", &spec, &settings(), None);
        assert!(!mounts_home(&plain));
        let json = serde_json::to_value(&plain).unwrap();
        assert!(json["spec"]["affinity"].is_null());
        assert!(json["spec"]["securityContext"]["fsGroup"].is_null());
    }

    #[test]
    fn only_a_plain_home_key_becomes_a_sub_path() {
        assert_eq!(home_sub_path("team-s1").as_deref(), Some("homes/team-s1"));
        for bad in ["", "..", ".hidden", "a/b", "a b", "../x", &"x".repeat(129)] {
            assert_eq!(home_sub_path(bad), None, "{bad:?}");
        }
    }
}
