//! The deployment files under `config/kubernetes/`: the Role grants exactly the spec's verbs,
//! the NetworkPolicy admits only the API, worker and web pods and denies private ranges, and
//! the Deployments run the kubernetes provider on Postgres.

fn read(name: &str) -> String {
    std::fs::read_to_string(format!(
        "{}/config/kubernetes/{name}",
        env!("CARGO_MANIFEST_DIR")
    ))
    .unwrap()
}

#[test]
fn the_role_grants_exactly_the_spec_verbs() {
    let rbac = read("rbac.yaml");
    let rules = "rules:\n  - apiGroups: [\"\"]\n    resources: [\"pods\"]\n    verbs: [\"create\", \"get\", \"delete\"]\n  - apiGroups: [\"\"]\n    resources: [\"pods/exec\"]\n    verbs: [\"create\", \"get\"]\n---";
    assert!(rbac.contains(rules), "{rbac}");
    assert_eq!(rbac.matches("verbs:").count(), 2);
    assert_eq!(rbac.matches("resources:").count(), 2);
    for broad in ["\"*\"", "list", "watch", "secrets", "ClusterRole\n"] {
        assert!(!rbac.contains(broad), "{broad}");
    }
    assert!(rbac.contains("kind: RoleBinding") && rbac.contains("name: rakazo-computers"));
}

#[test]
fn the_network_policy_admits_our_pods_and_denies_private_ranges() {
    let np = read("network-policy.yaml");
    assert!(np.contains("app.kubernetes.io/name: rakazo-computer"));
    assert!(np.contains("values: [\"rakazo-api\", \"rakazo-worker\", \"rakazo-web\"]"));
    assert!(np.contains("port: 6080") && np.contains("port: 6100"));
    for range in [
        "10.0.0.0/8",
        "172.16.0.0/12",
        "192.168.0.0/16",
        "169.254.0.0/16",
    ] {
        assert!(np.contains(&format!("- {range}")), "{range}");
    }
    assert!(np.contains("policyTypes: [\"Ingress\", \"Egress\"]"));
}

#[test]
fn the_deployments_run_the_kubernetes_provider() {
    let d = read("deployments.yaml");
    assert!(d.contains("SANDBOX_PROVIDER: kubernetes"));
    assert!(d.contains("args: [\"serve\", \"--no-worker\"]") && d.contains("args: [\"worker\"]"));
    assert!(!d.contains("replicas: 0"), "every process is built");
    assert!(d.contains("secretRef") && d.contains("serviceAccountName: rakazo"));
    // Mounted homes are offered, commented out, with both colocation variables.
    for var in [
        "# KUBERNETES_SANDBOX_HOME_CLAIM: rakazo-data",
        "# KUBERNETES_SANDBOX_HOME_COLOCATE_NAMESPACE: rakazo",
        "# KUBERNETES_SANDBOX_HOME_COLOCATE_LABELS:",
    ] {
        assert!(d.contains(var), "{var}");
    }
    // Every variable the files set is one the configuration knows.
    for line in d.lines().map(str::trim) {
        if let Some((key, _)) = line.split_once(": ")
            && key.chars().all(|c| c.is_ascii_uppercase() || c == '_')
            && key.len() > 3
        {
            assert!(
                rakazo::config::VARS.iter().any(|v| v.name == key),
                "{key} is not a configuration variable"
            );
        }
    }
}
