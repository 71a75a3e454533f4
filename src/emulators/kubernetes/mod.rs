//! The kubernetes emulator (`rakazo emulator kubernetes --listen ADDR`): the part of the
//! Kubernetes API that the `kubernetes` provider and kubectl use, with pods backed by real
//! Docker containers. No cluster can be installed on the machines this project is built on;
//! this stands in for one, faithfully enough for kubectl and kube-rs unchanged.
//!
//! Served: `/version`, discovery (`/api`, `/apis`, `/api/v1`), the OpenAPI v3 documents kubectl
//! validates with, pods create/get/list (label and field selectors)/watch/delete, and
//! `pods/exec` over WebSockets ([`exec`]). Every request must carry the bearer token when one
//! is configured. Not served: other resources, patch/update, SPDY exec, logs.
//!
//! - [`documents`]: fixed documents, statuses, selectors.
//! - [`pods`]: the pod objects and their containers.
//! - [`exec`]: exec over WebSockets.

pub mod documents;
pub mod exec;
pub mod pods;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use bytes::Bytes;
use futures_util::StreamExt as _;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use documents::{Selector, query_pairs, status};
use pods::{ApiError, Pods, selects};

/// How the emulator is set up.
#[derive(Clone, Debug)]
pub struct EmulatorConfig {
    /// Where it listens.
    pub listen: SocketAddr,
    /// The bearer token every request must carry (`None`: no authentication, loopback trials
    /// only).
    pub token: Option<String>,
    /// The node's persistent volumes: a PersistentVolumeClaim's name (in any namespace) and
    /// the directory of this host that holds its volume.
    pub claims: std::collections::HashMap<String, std::path::PathBuf>,
}

/// A running emulator.
pub struct Emulator {
    /// Where it listens.
    pub addr: SocketAddr,
    pods: Arc<Pods>,
    server: actix_web::dev::ServerHandle,
}

impl Emulator {
    /// Starts the emulator on the current actix system.
    pub async fn start(config: EmulatorConfig) -> std::io::Result<Self> {
        let pods = Arc::new(
            Pods::connect(config.claims.clone())
                .await
                .map_err(std::io::Error::other)?,
        );
        actix_web::rt::spawn(pods.clone().follow());
        let token = config.token.clone();
        let data = web::Data::new(pods.clone());
        let server = HttpServer::new(move || {
            let token = token.clone();
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(4 << 20))
                .wrap(actix_web::middleware::from_fn(move |req, next| {
                    authenticate(token.clone(), req, next)
                }))
                .route(
                    "/version",
                    web::get().to(|| async { HttpResponse::Ok().json(documents::version()) }),
                )
                .route("/api", web::get().to(api))
                .route(
                    "/apis",
                    web::get().to(|| async { HttpResponse::Ok().json(documents::api_groups()) }),
                )
                .route(
                    "/api/v1",
                    web::get()
                        .to(|| async { HttpResponse::Ok().json(documents::core_resources()) }),
                )
                .route(
                    "/openapi/v3",
                    web::get().to(|| async { HttpResponse::Ok().json(documents::openapi_index()) }),
                )
                .route(
                    "/openapi/v3/api/v1",
                    web::get().to(|| async { HttpResponse::Ok().json(documents::openapi_core()) }),
                )
                .route("/api/v1/namespaces/{ns}", web::get().to(namespace))
                .route("/api/v1/pods", web::get().to(list_all))
                .route("/api/v1/namespaces/{ns}/pods", web::get().to(list))
                .route("/api/v1/namespaces/{ns}/pods", web::post().to(create))
                .route("/api/v1/namespaces/{ns}/pods/{name}", web::get().to(get))
                .route(
                    "/api/v1/namespaces/{ns}/pods/{name}",
                    web::delete().to(delete),
                )
                .route(
                    "/api/v1/namespaces/{ns}/pods/{name}/exec",
                    web::get().to(exec::exec),
                )
                .route(
                    "/api/v1/namespaces/{ns}/pods/{name}/exec",
                    web::post().to(exec::exec),
                )
                .default_service(web::to(|req: HttpRequest| async move {
                    HttpResponse::NotFound().json(status(
                        404,
                        "NotFound",
                        &format!(
                            "the server could not find the requested resource ({})",
                            req.path()
                        ),
                    ))
                }))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .bind(config.listen)?;
        let addr = server.addrs()[0];
        let server = server.run();
        let handle = server.handle();
        actix_web::rt::spawn(server);
        tracing::info!(listen = %addr, "kubernetes_emulator.started");
        Ok(Self {
            addr,
            pods,
            server: handle,
        })
    }

    /// Starts the emulator on a thread of its own (for tests, whose runtimes come and go).
    pub fn spawn(config: EmulatorConfig) -> std::io::Result<SocketAddr> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("kubernetes-emulator".into())
            .spawn(move || {
                actix_web::rt::System::new().block_on(async move {
                    match Self::start(config).await {
                        Ok(emulator) => {
                            let _ = tx.send(Ok(emulator.addr));
                            std::future::pending::<()>().await;
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                        }
                    }
                })
            })?;
        rx.recv().map_err(std::io::Error::other)?
    }

    /// Stops serving and removes every container of this emulator.
    pub async fn stop(self) {
        self.server.stop(true).await;
        self.pods.remove_all().await;
    }
}

async fn authenticate(
    token: Option<String>,
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    if let Some(token) = token {
        let given = req
            .headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .unwrap_or("");
        if !bool::from(given.as_bytes().ct_eq(token.as_bytes())) {
            let resp =
                HttpResponse::Unauthorized().json(status(401, "Unauthorized", "Unauthorized"));
            return Ok(req.into_response(resp).map_into_right_body());
        }
    }
    next.call(req)
        .await
        .map(ServiceResponse::map_into_left_body)
}

fn respond(result: Result<Value, ApiError>, ok: u16) -> HttpResponse {
    let (code, body) = match result {
        Ok(v) => (ok, v),
        Err(e) => e,
    };
    HttpResponse::build(actix_web::http::StatusCode::from_u16(code).unwrap()).json(body)
}

async fn api(req: HttpRequest) -> HttpResponse {
    let host = req.connection_info().host().to_owned();
    HttpResponse::Ok().json(documents::api_versions(&host))
}

async fn namespace(path: web::Path<String>) -> HttpResponse {
    let ns = path.into_inner();
    HttpResponse::Ok().json(json!({
        "kind": "Namespace", "apiVersion": "v1",
        "metadata": {"name": ns},
        "spec": {"finalizers": ["kubernetes"]},
        "status": {"phase": "Active"}
    }))
}

async fn create(pods: web::Data<Arc<Pods>>, path: web::Path<String>, body: Bytes) -> HttpResponse {
    let pod: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => {
            return respond(
                Err((
                    400,
                    status(400, "BadRequest", "the body is not a JSON object"),
                )),
                400,
            );
        }
    };
    if pod["kind"].as_str().is_some_and(|k| k != "Pod") {
        return respond(
            Err((400, status(400, "BadRequest", "only pods are served here"))),
            400,
        );
    }
    respond(pods.create(&path.into_inner(), pod), 201)
}

async fn get(pods: web::Data<Arc<Pods>>, path: web::Path<(String, String)>) -> HttpResponse {
    let (ns, name) = path.into_inner();
    respond(pods.get(&ns, &name), 200)
}

async fn delete(pods: web::Data<Arc<Pods>>, path: web::Path<(String, String)>) -> HttpResponse {
    let (ns, name) = path.into_inner();
    respond(pods.delete(&ns, &name), 200)
}

async fn list(
    req: HttpRequest,
    pods: web::Data<Arc<Pods>>,
    path: web::Path<String>,
) -> HttpResponse {
    let ns = path.into_inner();
    list_in(req, pods, Some(ns)).await
}

async fn list_all(req: HttpRequest, pods: web::Data<Arc<Pods>>) -> HttpResponse {
    list_in(req, pods, None).await
}

async fn list_in(req: HttpRequest, pods: web::Data<Arc<Pods>>, ns: Option<String>) -> HttpResponse {
    let q = query_pairs(req.query_string());
    let param = |k: &str| q.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    let (Some(labels), Some(fields)) = (
        Selector::parse(&param("labelSelector").unwrap_or_default()),
        Selector::parse(&param("fieldSelector").unwrap_or_default()),
    ) else {
        return respond(
            Err((400, status(400, "BadRequest", "unsupported selector"))),
            400,
        );
    };
    if param("watch").is_some_and(|w| w == "true" || w == "1") {
        let since: u64 = param("resourceVersion")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let timeout = param("timeoutSeconds")
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(1800)
            .min(1800);
        return watch(pods.get_ref().clone(), ns, labels, fields, since, timeout);
    }
    let (rv, items) = pods.list(ns.as_deref(), &labels, &fields);
    HttpResponse::Ok().json(json!({
        "kind": "PodList", "apiVersion": "v1",
        "metadata": {"resourceVersion": rv},
        "items": items
    }))
}

/// A watch: newline-delimited events after resource version `since` (every current pod as
/// `ADDED` first when `since` is 0), until `timeout` seconds pass.
fn watch(
    pods: Arc<Pods>,
    ns: Option<String>,
    labels: Selector,
    fields: Selector,
    since: u64,
    timeout: u64,
) -> HttpResponse {
    let rx = pods.subscribe();
    let initial: Vec<Value> = if since == 0 {
        pods.list(ns.as_deref(), &labels, &fields)
            .1
            .into_iter()
            .map(|pod| json!({"type": "ADDED", "object": pod}))
            .collect()
    } else {
        // Changes between `since` and the subscription: the current state of each pod newer
        // than `since`.
        pods.list(ns.as_deref(), &labels, &fields)
            .1
            .into_iter()
            .filter(|pod| {
                pod["metadata"]["resourceVersion"]
                    .as_str()
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_some_and(|rv| rv > since)
            })
            .map(|pod| json!({"type": "MODIFIED", "object": pod}))
            .collect()
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(timeout);
    let first = futures_util::stream::iter(initial.into_iter().map(line));
    let filter = Arc::new((ns, labels, fields));
    let later = futures_util::stream::unfold(rx, move |mut rx| {
        let filter = filter.clone();
        async move {
            loop {
                let event = tokio::time::timeout_at(deadline, rx.recv()).await.ok()?;
                match event {
                    Ok(ev) => {
                        let (ns, labels, fields) = &*filter;
                        let in_ns = ns
                            .as_deref()
                            .is_none_or(|ns| ev.pod["metadata"]["namespace"] == json!(ns));
                        if in_ns && selects(&ev.pod, labels, fields) {
                            return Some((line(json!({"type": ev.kind, "object": ev.pod})), rx));
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(_) => return None,
                }
            }
        }
    });
    HttpResponse::Ok()
        .content_type("application/json")
        .streaming(first.chain(later))
}

fn line(v: Value) -> Result<Bytes, actix_web::Error> {
    let mut s = v.to_string();
    s.push('\n');
    Ok(Bytes::from(s))
}
