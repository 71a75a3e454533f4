//! Test harness: the whole app on a real HTTP listener at 127.0.0.1:0, on SQLite or on the
//! Postgres server the test script starts, with a JSON-RPC client.
#![allow(dead_code)]

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use rakazo::app::App;
use rakazo::config::Config;
use sea_orm::ConnectionTrait;
use serde_json::{Value, json};

pub mod desktop;
#[path = "../gate/mod.rs"]
pub mod gate;
pub mod mcp;
pub mod terminal;

/// Sends the product's log events (`info` and up) to the running test's captured output,
/// which the test harness prints only when the test fails: a rare failure then says which
/// path the product took. Installed once per test binary; a binary that installs its own
/// subscriber does not call this.
pub fn capture_logs() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_ansi(false)
        .with_env_filter("warn,rakazo=info,rakazo_actors=info")
        .try_init();
}

/// Which database a test runs on.
#[derive(Clone, Copy, Debug)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The admin URL of the test Postgres server (set by scripts/test.sh); a missing one fails the
/// test (see `gate`).
pub fn postgres_admin_url() -> Option<String> {
    match std::env::var("RAKAZO_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            gate::missing(
                "the Postgres server (RAKAZO_TEST_POSTGRES_URL)",
                gate::POSTGRES,
            );
            None
        }
    }
}

/// A fresh, empty Postgres database; its URL.
pub async fn fresh_postgres_db(admin: &str) -> String {
    let name = format!("rakazo_test_{}", uuid::Uuid::new_v4().simple());
    let conn = sea_orm::Database::connect(admin)
        .await
        .expect("connect to the test Postgres server");
    conn.execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create database");
    let base = admin.rsplit_once('/').map_or(admin, |(b, _)| b);
    format!("{base}/{name}")
}

/// A running server.
pub struct TestServer {
    pub app: Arc<App>,
    pub base: String,
    pub operator_token: String,
    pub http: reqwest::Client,
    _dir: tempfile::TempDir,
    _handle: actix_web::dev::ServerHandle,
}

/// The outcome of one RPC call: the result, or (HTTP status, error code, message).
pub type CallResult = Result<Value, (u16, String, String)>;

impl TestServer {
    /// Start on a backend with extra environment; `None` when Postgres is not available here.
    pub async fn start(backend: Backend, extra: &[(&str, &str)]) -> Option<TestServer> {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut env: HashMap<String, String> = HashMap::from([
            ("DATA_DIR".into(), dir.path().display().to_string()),
            ("SANDBOX_PROVIDER".into(), "fake".into()),
            ("RAKAZO_ENV".into(), "test".into()),
        ]);
        if let Backend::Postgres = backend {
            let admin = postgres_admin_url()?;
            env.insert("DATABASE_URL".into(), fresh_postgres_db(&admin).await);
        }
        for (k, v) in extra {
            env.insert((*k).into(), (*v).into());
        }
        let config = Config::load(&env, None).expect("config");
        let (app, token) = App::start(config).await.expect("app starts");
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let server = rakazo::server::build(app.clone(), listener, 1).unwrap();
        let handle = server.handle();
        actix_rt::spawn(server);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        Some(TestServer {
            app,
            base,
            operator_token: token.expect("first start makes the operator token"),
            http,
            _dir: dir,
            _handle: handle,
        })
    }

    /// The app on SQLite with the `docker` provider, talking to the supervisor at `url`.
    pub async fn docker(url: &str, token: &str) -> TestServer {
        TestServer::start(
            Backend::Sqlite,
            &[
                ("SANDBOX_PROVIDER", "docker"),
                ("SANDBOX_SUPERVISOR_URL", url),
                ("SANDBOX_SUPERVISOR_TOKEN", token),
            ],
        )
        .await
        .expect("the app starts")
    }

    /// One JSON-RPC call as `token`.
    pub async fn call_as(&self, token: &str, method: &str, params: Value) -> CallResult {
        let body = json!({ "jsonrpc": "2.0", "id": 1, "method": method, "params": params });
        let resp = self
            .http
            .post(format!("{}/rpc", self.base))
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
            .expect("request");
        let status = resp.status().as_u16();
        let v: Value = resp.json().await.expect("json body");
        match v.get("error") {
            Some(e) => Err((
                status,
                e["data"]["code"].as_str().unwrap_or_default().to_owned(),
                e["message"].as_str().unwrap_or_default().to_owned(),
            )),
            None => {
                assert_eq!(status, 200);
                Ok(v["result"].clone())
            }
        }
    }

    /// The body of `GET /internal/health`.
    pub async fn health(&self) -> Value {
        let resp = self
            .http
            .get(format!("{}/internal/health", self.base))
            .send()
            .await
            .expect("health");
        resp.json().await.expect("health body")
    }

    /// One call as the operator, expected to succeed.
    pub async fn ok(&self, method: &str, params: Value) -> Value {
        match self.call(method, params.clone()).await {
            Ok(v) => v,
            Err(e) => panic!("{method} {params} failed: {e:?}"),
        }
    }

    /// One call as the operator.
    pub async fn call(&self, method: &str, params: Value) -> CallResult {
        self.call_as(&self.operator_token, method, params).await
    }

    /// A new user, member of `space`; returns their token.
    pub async fn member_token(&self, space: &str) -> String {
        let user = self.ok("user.create", json!({ "name": "member" })).await;
        self.ok(
            "space.addMember",
            json!({ "spaceId": space, "userId": user["id"] }),
        )
        .await;
        user["token"].as_str().unwrap().to_owned()
    }

    /// A space with `n` bots of `mode`; returns (space id, bot ids).
    pub async fn space_with_bots(&self, n: usize, mode: &str) -> (String, Vec<String>) {
        let space = self.ok("space.create", json!({ "name": "Acme" })).await["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let mut bots = Vec::new();
        for i in 0..n {
            let bot = self
                .ok(
                    "bot.create",
                    json!({ "spaceId": space, "name": format!("bot {i}"), "computerMode": mode }),
                )
                .await;
            bots.push(bot["id"].as_str().unwrap().to_owned());
        }
        (space, bots)
    }

    /// Start a run of a bot: (run id, fence).
    pub async fn start_run(&self, bot: &str) -> (String, i64) {
        let started = self.ok("run.start", json!({ "botId": bot })).await;
        (
            started["run"]["id"].as_str().unwrap().to_owned(),
            started["lease"]["fence"].as_i64().unwrap(),
        )
    }

    /// Run a shell command under a run's fence.
    pub async fn exec(&self, run: &str, fence: i64, command: &str) -> CallResult {
        self.call(
            "computer.exec",
            json!({ "runId": run, "fence": fence, "command": command }),
        )
        .await
    }
}

impl Drop for TestServer {
    /// Host desktops are detached processes: stop every one this server started.
    fn drop(&mut self) {
        let prefix = format!("{}/", self.app.config.data_dir.join("run").display());
        let _ = std::process::Command::new("bash")
            .arg("-c")
            .arg(rakazo::desktop::command::sweep_script(&prefix))
            .status();
    }
}

/// Instantiate an async scenario on both SQLite and Postgres.
#[macro_export]
macro_rules! on_both_databases {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[actix_rt::test]
                async fn $name() {
                    let server = $crate::common::TestServer::start($crate::common::Backend::Sqlite, &[]).await.unwrap();
                    super::$name(server).await;
                }
            )*
        }
        mod postgres {
            $(
                #[actix_rt::test]
                async fn $name() {
                    let Some(server) = $crate::common::TestServer::start($crate::common::Backend::Postgres, &[]).await else {
                        return;
                    };
                    super::$name(server).await;
                }
            )*
        }
    };
}
