//! The internal-RPC authority client against a fake API: every answer maps to its reason.

mod common;

use std::net::TcpListener;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{App, HttpRequest, HttpResponse, HttpServer, web};
use common::capability;
use rakazo_web_proxy::authority::{
    Authority, AuthorityError, AuthorityRequest, HttpAuthority, RejectCause,
};
use rakazo_web_proxy::capability::Policy;

const SECRET: &str = "internal-rpc-secret";

/// The fake API answers according to the `mode` it is set to.
async fn screen_authority(
    req: HttpRequest,
    body: web::Json<AuthorityRequest>,
    mode: web::Data<Arc<Mutex<&'static str>>>,
    seen: web::Data<Arc<Mutex<Vec<AuthorityRequest>>>>,
) -> HttpResponse {
    let auth = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok());
    if auth != Some(&format!("Bearer {SECRET}")) {
        return HttpResponse::Unauthorized().finish();
    }
    seen.lock().unwrap().push(body.into_inner());
    let mode = *mode.lock().unwrap();
    match mode {
        "ok" => HttpResponse::Ok().json(serde_json::json!({
            "upstream": "http://10.1.2.3:6080",
            "socketToken": "tok_123",
            "policy": "view",
        })),
        "stale" => HttpResponse::Conflict().json(serde_json::json!({"reason": "stale_generation"})),
        "lease" => HttpResponse::Forbidden().json(serde_json::json!({"reason": "lease_ended"})),
        "gone" => HttpResponse::NotFound().body("no such computer"),
        "error" => HttpResponse::InternalServerError().body("boom"),
        "malformed" => HttpResponse::Ok().body("{\"upstream\": 5}"),
        "not_json" => HttpResponse::Ok().body("<html>"),
        "bad_upstream" => HttpResponse::Ok().json(serde_json::json!({
            "upstream": "https://10.1.2.3:6080",
            "socketToken": "tok",
            "policy": "view",
        })),
        "bad_token" => HttpResponse::Ok().json(serde_json::json!({
            "upstream": "http://10.1.2.3:6080",
            "socketToken": "../../etc",
            "policy": "view",
        })),
        "slow" => {
            tokio::time::sleep(Duration::from_secs(3)).await;
            HttpResponse::Ok().finish()
        }
        _ => unreachable!(),
    }
}

#[actix_rt::test]
async fn http_authority_maps_every_answer() {
    let mode = Arc::new(Mutex::new("ok"));
    let seen = Arc::new(Mutex::new(Vec::<AuthorityRequest>::new()));
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let (m, s) = (mode.clone(), seen.clone());
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(m.clone()))
            .app_data(web::Data::new(s.clone()))
            .route(
                "/api/internal/screen-authority",
                web::post().to(screen_authority),
            )
    })
    .workers(1)
    .disable_signals()
    .listen(listener)
    .unwrap()
    .run();
    actix_rt::spawn(server);

    let base = format!("http://{addr}/api");
    let authority = HttpAuthority::new(&base, SECRET, Duration::from_millis(500)).unwrap();
    let cap = capability(Policy::Control, 4, 12);

    let target = authority.target(&cap).await.unwrap();
    assert_eq!(target.policy(), Policy::View);
    assert_eq!(seen.lock().unwrap()[0], AuthorityRequest::from(&cap));

    let cases: &[(&'static str, AuthorityError)] = &[
        (
            "stale",
            AuthorityError::Rejected(RejectCause::StaleGeneration),
        ),
        ("lease", AuthorityError::Rejected(RejectCause::LeaseEnded)),
        ("gone", AuthorityError::Rejected(RejectCause::NotFound)),
        ("error", AuthorityError::Rejected(RejectCause::ApiError)),
        (
            "malformed",
            AuthorityError::InvalidResponse("malformed_body"),
        ),
        (
            "not_json",
            AuthorityError::InvalidResponse("malformed_body"),
        ),
        (
            "bad_upstream",
            AuthorityError::InvalidResponse("bad_upstream"),
        ),
        (
            "bad_token",
            AuthorityError::InvalidResponse("bad_socket_token"),
        ),
        ("slow", AuthorityError::Unavailable("timeout")),
    ];
    for (case, expected) in cases {
        *mode.lock().unwrap() = case;
        assert_eq!(
            &authority.target(&cap).await.unwrap_err(),
            expected,
            "{case}"
        );
    }

    // A wrong bearer is a rejection by the API.
    let wrong = HttpAuthority::new(&base, "nope", Duration::from_millis(500)).unwrap();
    *mode.lock().unwrap() = "ok";
    assert_eq!(
        wrong.target(&cap).await.unwrap_err(),
        AuthorityError::Rejected(RejectCause::ApiError)
    );

    // Nothing listening.
    let closed = TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let unreachable = HttpAuthority::new(&dead, SECRET, Duration::from_millis(500)).unwrap();
    assert_eq!(
        unreachable.target(&cap).await.unwrap_err(),
        AuthorityError::Unavailable("connect")
    );
    assert!(HttpAuthority::new("not a url", SECRET, Duration::from_secs(1)).is_err());
}
