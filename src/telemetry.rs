//! Structured logging: `tracing` events with stable dotted names, filtered by `RAKAZO_LOG`.
//! Events never carry secrets, capability URLs, socket tokens, cookies or provider hosts.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

/// The Kubernetes client crates, kept to warnings: their debug spans name the API server and
/// each request's URL.
pub const KUBE_QUIET: &str = "kube_client=warn,kube=warn,kube_runtime=warn,tower=info";

/// Install the global subscriber (once; later calls are ignored).
pub fn init(filter: &str) {
    // Colour codes only for a person's terminal, never into a file, pipe or journal.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(safe_filter(filter))
        .with_target(false)
        .with_ansi(std::io::stdout().is_terminal())
        .try_init();
}

/// The operator's `filter`, with the client crates that name hosts and URLs kept quiet.
fn safe_filter(filter: &str) -> EnvFilter {
    // The HTTP and websocket client crates name upstream hosts at debug level, and the
    // Kubernetes client spans every request with its URL (a pod's exec URL carries the
    // script and its environment): they stay quiet whatever the operator asks for.
    let safe = format!("{},{KUBE_QUIET}", rakazo_web_proxy::SAFE_LOG_DIRECTIVES);
    EnvFilter::try_new(format!("{filter},{safe}"))
        .unwrap_or_else(|_| EnvFilter::new(format!("info,{safe}")))
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// What the subscriber writes, kept.
    #[derive(Clone, Default)]
    struct Kept(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Kept {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Even at `trace`, the Kubernetes client's request spans and events (which name the
    /// API server and a pod exec's script) are not logged; the runtime's own are.
    #[test]
    fn trace_logs_no_kubernetes_request_url() {
        let kept = Kept::default();
        let writer = kept.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(safe_filter("trace"))
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            let url =
                "https://api.cluster.example/api/v1/namespaces/x/pods/p/exec?command=SECRET=1";
            let span = tracing::debug_span!(target: "kube_client::client", "HTTP", http.url = %url);
            span.in_scope(|| {
                tracing::debug!(target: "kube_client::client", url, "requesting");
                tracing::info!(event = "kubernetes.test", "ours");
            });
        });
        let text = String::from_utf8(kept.0.lock().unwrap().clone()).unwrap();
        assert!(text.contains("kubernetes.test"), "{text}");
        assert!(
            !text.contains("cluster.example") && !text.contains("SECRET"),
            "{text}"
        );
    }
}
