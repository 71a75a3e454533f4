//! The table of every configuration variable: its name, default and meaning. The annotated
//! example file in `config/` is rendered from this table (and a test keeps them equal).

/// One documented variable.
pub struct Var {
    /// Environment variable name; the same name in lower case is its key in TOML files.
    pub name: &'static str,
    /// Default, as written in the example (empty = unset).
    pub default: &'static str,
    /// Whether the value is a secret (never logged).
    pub secret: bool,
    /// What it does and what it accepts.
    pub doc: &'static str,
}

/// The provider names `SANDBOX_PROVIDER` accepts.
pub const PROVIDERS: &[&str] = &[
    "docker",
    "e2b",
    "daytona",
    "box",
    "novita",
    "e2b-emulator",
    "novita-emulator",
    "daytona-emulator",
    "box-emulator",
    "desktop",
    "fake",
    "kubernetes",
    "none",
];

/// Other names `SANDBOX_PROVIDER` takes for a provider of [`PROVIDERS`] (the vendor's older
/// name).
pub const PROVIDER_ALIASES: &[(&str, &str)] = &[("boat", "box"), ("boat-emulator", "box-emulator")];

/// The deployment environments `RAKAZO_ENV` accepts.
pub const ENVIRONMENTS: &[&str] = &["production", "development", "test"];

/// Every variable, in the order the example file lists them.
pub const VARS: &[Var] = &[
    Var {
        name: "RAKAZO_ENV",
        default: "production",
        secret: false,
        doc: "Deployment environment: production, development or test. The desktop provider runs only in development or test.",
    },
    Var {
        name: "RAKAZO_LOG",
        default: "info",
        secret: false,
        doc: "Log filter (tracing EnvFilter syntax), for example `info,rakazo=debug`.",
    },
    Var {
        name: "RAKAZO_LISTEN",
        default: "127.0.0.1:3100",
        secret: false,
        doc: "Address the API, dashboard and screen proxy listen on (`rakazo serve --listen` overrides).",
    },
    Var {
        name: "DATA_DIR",
        default: "./data",
        secret: false,
        doc: "Rakazo-owned data: the SQLite database, homes, revisions and generated keys. Put it on a persistent, encrypted volume.",
    },
    Var {
        name: "DATABASE_URL",
        default: "",
        secret: true,
        doc: "Database URL: `sqlite://PATH` or `postgres://USER:PASSWORD@HOST/DB`. Unset: SQLite at DATA_DIR/rakazo.db.",
    },
    Var {
        name: "SANDBOX_PROVIDER",
        default: "docker",
        secret: false,
        doc: "Where computers run: docker, e2b, novita, daytona, box (also named boat), kubernetes, their offline emulators (e2b-emulator, novita-emulator, daytona-emulator, box-emulator), desktop, fake or none.",
    },
    Var {
        name: "SANDBOX_IDLE_MS",
        default: "600000",
        secret: false,
        doc: "Suspend a computer after this many milliseconds without use (0 = never).",
    },
    Var {
        name: "COMPUTER_MAX_ACTIVE_MS",
        default: "7200000",
        secret: false,
        doc: "On providers that bill while running, suspend after this long up in one stretch unless a run executes, a user controls a screen or a coding agent CLI wrote its session within SANDBOX_IDLE_MS (0 = never).",
    },
    Var {
        name: "COMPUTER_MAINTENANCE_HEARTBEAT_TIMEOUT_MS",
        default: "600000",
        secret: false,
        doc: "A maintenance operation whose worker has not beaten for this long is marked interrupted (it stays reserved until released).",
    },
    Var {
        name: "RUN_LEASE_TTL_MS",
        default: "300000",
        secret: false,
        doc: "Lifetime of a run's execution lease unless renewed (`run.renew`; MCP sessions renew it themselves while they live), in milliseconds (at least 1000).",
    },
    Var {
        name: "MCP_SESSION_IDLE_MS",
        default: "1800000",
        secret: false,
        doc: "End an MCP session after this many milliseconds without a call: its run ends as canceled, with a checkpoint (at least 1000).",
    },
    Var {
        name: "RPC_WS_RECHECK_MS",
        default: "30000",
        secret: false,
        doc: "How often an open `/rpc/ws` socket's token is looked up again: a token that no longer authenticates (its user or bot deleted) closes the socket, and spaces the caller no longer sees stop sending events (at least 1000).",
    },
    Var {
        name: "RAKAZO_PROCESS_GONE_MS",
        default: "60000",
        secret: false,
        doc: "A process (serve or worker) whose heartbeat is silent this many milliseconds is gone: its reservations are released and another process adopts its computers; heartbeats come six times as often. Use one value for every process of a deployment (at least 1000).",
    },
    Var {
        name: "RAKAZO_RECONCILE_INTERVAL_MS",
        default: "60000",
        secret: false,
        doc: "How often a worker (or plain serve) adopts computers no live process holds, closes stretches nobody saw end and expires stale grants, in milliseconds (at least 1000).",
    },
    Var {
        name: "RAKAZO_INTERNAL_URL",
        default: "",
        secret: false,
        doc: "Base URL at which the deployment's other processes reach this process's internal endpoints (machine calls for computers it holds); empty = http:// and RAKAZO_LISTEN, which must then not be a wildcard address when several processes share a database.",
    },
    Var {
        name: "RAKAZO_HOST",
        default: "",
        secret: false,
        doc: "Names the loopback this process shares with the deployment's other processes: a process relays the screens of a computer another holds straight to that process's gateways when both name the same host, and through that process's screen proxy otherwise; empty = the kernel's boot id and this process's network namespace (right for processes on one machine or in one pod).",
    },
    Var {
        name: "SANDBOX_TEAM_SCREEN_LIMIT",
        default: "0",
        secret: false,
        doc: "Cap on simultaneous desktops per computer (0 = no cap); at the cap a new desktop takes the place of the oldest idle one that no person controls and whose bot has no run, else graphical tools answer MULTI_SCREEN_UNAVAILABLE.",
    },
    Var {
        name: "SANDBOX_DESKTOP_CPU_WEIGHT",
        default: "100",
        secret: false,
        doc: "CPU weight of each bot's desktop (Xvfb, window manager, browser) in its own control group, 1 to 10000 (100 = an equal share); 0 turns per-desktop control groups off (and with them the memory ceiling and freezing). Needs a process that owns control groups: the host desktop provider running as root, or for Docker computers a supervisor running as root on a cgroup v1 host (it nests the groups under each container's own).",
    },
    Var {
        name: "SANDBOX_DESKTOP_MEMORY_MB",
        default: "2048",
        secret: false,
        doc: "Memory ceiling of each bot's desktop in MiB (0 = none); a desktop over it loses a browser tab (the OOM killer takes the renderer), not the computer, and the bot's next screenshot says so.",
    },
    Var {
        name: "SANDBOX_DESKTOP_FREEZE_MS",
        default: "300000",
        secret: false,
        doc: "Freeze a desktop with no tool call, viewer or control for this many milliseconds (its processes stop using CPU, memory stays); the next tool call or viewer thaws it (0 = never).",
    },
    Var {
        name: "SANDBOX_DESKTOP_WARM_STACKS",
        default: "0",
        secret: false,
        doc: "Spare desktops (Xvfb, window manager and a browser on a spare profile of no bot's) each computer keeps started for its next desktops, refilled in the background after one is taken: a bot with no browser profile yet takes the running browser, whose profile becomes its own; any other bot gets the display stack and its own browser. Each holds about 200 MiB (PSS, measured beside one open desktop; see BENCHMARKS.md) and is listed under warmDesktops in health (0, the default: none, every desktop starts its own).",
    },
    Var {
        name: "SANDBOX_DESKTOP_START_NICE",
        default: "0",
        secret: false,
        doc: "With SANDBOX_PROVIDER=desktop: how far below the runtime's CPU priority a desktop runs while it starts, back at the runtime's once its browser is open (0 to 19). Without desktop groups (SANDBOX_DESKTOP_CPU_WEIGHT=0, or groups unavailable) its browser and window manager start at that nice value and are raised back (needs a runtime allowed to raise priorities, CAP_SYS_NICE; ignored without it); with desktop groups on cgroup v1 its CPU share is weighed in one group beside the runtime's own, of the weight of a thread at that nice value (cgroup v2: ignored). Running bots' screenshots stay quicker while another desktop starts; a start that waits for a CPU most of the time (beside other CPU-heavy work) is raised at once, so it opens only a little slower (see BENCHMARKS.md). 0, the default: desktops start at the runtime's priority.",
    },
    Var {
        name: "SANDBOX_COMMAND_TIMEOUT_MS",
        default: "300000",
        secret: false,
        doc: "Default and maximum timeout of a shell command, in milliseconds.",
    },
    Var {
        name: "SANDBOX_FAKE_SINGLE_SCREEN",
        default: "false",
        secret: false,
        doc: "With SANDBOX_PROVIDER=fake: emulate a single-desktop vendor (true or false).",
    },
    Var {
        name: "SANDBOX_SUPERVISOR_URL",
        default: "http://127.0.0.1:7091",
        secret: false,
        doc: "URL of the Docker supervisor (`rakazo supervisor`); keep it on loopback or a private network.",
    },
    Var {
        name: "SANDBOX_SUPERVISOR_TOKEN",
        default: "",
        secret: true,
        doc: "Shared token between API and supervisor; required for docker, distinct from every other secret.",
    },
    Var {
        name: "SANDBOX_SUPERVISOR_LISTEN",
        default: "127.0.0.1:7091",
        secret: false,
        doc: "Address `rakazo supervisor` listens on: a loopback or private address only (it refuses a public one).",
    },
    Var {
        name: "SANDBOX_TEMPLATE",
        default: "rakazo-computer",
        secret: false,
        doc: "With e2b or novita: the template computers are created from (it needs the desktop packages of the computer image). Novita requires it to exist in the key's account (no stock fallback).",
    },
    Var {
        name: "E2B_API_KEY",
        default: "",
        secret: true,
        doc: "With SANDBOX_PROVIDER=e2b: the E2B API key (required; never logged).",
    },
    Var {
        name: "E2B_DOMAIN",
        default: "e2b.app",
        secret: false,
        doc: "With e2b: E2B's domain (port hosts are <port>-<sandbox id>.<domain>).",
    },
    Var {
        name: "E2B_API_URL",
        default: "",
        secret: false,
        doc: "With e2b: the control plane's URL. Unset: https://api.<E2B_DOMAIN>.",
    },
    Var {
        name: "NOVITA_API_KEY",
        default: "",
        secret: true,
        doc: "With SANDBOX_PROVIDER=novita: the Novita API key (required; never logged).",
    },
    Var {
        name: "NOVITA_DOMAIN",
        default: "sandbox.novita.ai",
        secret: false,
        doc: "With novita: Novita's sandbox domain (port hosts are <port>-<sandbox id>.<domain>).",
    },
    Var {
        name: "NOVITA_API_URL",
        default: "",
        secret: false,
        doc: "With novita: the control plane's URL. Unset: https://api.<NOVITA_DOMAIN>.",
    },
    Var {
        name: "DAYTONA_API_KEY",
        default: "",
        secret: true,
        doc: "With SANDBOX_PROVIDER=daytona: the Daytona API key (required; never logged).",
    },
    Var {
        name: "DAYTONA_API_URL",
        default: "https://app.daytona.io/api",
        secret: false,
        doc: "With daytona: the API's URL, with its /api prefix.",
    },
    Var {
        name: "DAYTONA_TARGET",
        default: "",
        secret: false,
        doc: "With daytona: the region sandboxes are created in (empty: the organization's default).",
    },
    Var {
        name: "DAYTONA_SNAPSHOT",
        default: "",
        secret: false,
        doc: "With daytona: the snapshot sandboxes start from (it needs the desktop packages of the computer image; empty: Daytona's default).",
    },
    Var {
        name: "BOAT_API_KEY",
        default: "",
        secret: true,
        doc: "With SANDBOX_PROVIDER=box: the Box (Boat) API key (required; never logged).",
    },
    Var {
        name: "BOAT_API_URL",
        default: "https://boat.dev/api/v1",
        secret: false,
        doc: "With box: the API's URL.",
    },
    Var {
        name: "SANDBOX_DOCKER_IMAGE",
        default: "",
        secret: false,
        doc: "Computer image of docker computers. Unset: rakazo-computer:<hash of the built-in recipe>, built by `rakazo image build`.",
    },
    Var {
        name: "SANDBOX_DOCKER_CPUS",
        default: "2",
        secret: false,
        doc: "CPU ceiling of each docker computer, in CPUs (decimals allowed, 0 = none).",
    },
    Var {
        name: "SANDBOX_DOCKER_MEMORY_MB",
        default: "4096",
        secret: false,
        doc: "Memory ceiling of each docker computer in MiB (0 = none).",
    },
    Var {
        name: "SANDBOX_DOCKER_PIDS_LIMIT",
        default: "2048",
        secret: false,
        doc: "Most processes and threads in each docker computer (0 = none).",
    },
    Var {
        name: "SANDBOX_DOCKER_NETWORK",
        default: "bridge",
        secret: false,
        doc: "Network of docker computers: bridge (outbound access through the egress guard, screen gateway published on 127.0.0.1) or none (no network at all; the guard is then not needed).",
    },
    Var {
        name: "SANDBOX_DOCKER_WARM_COMPUTERS",
        default: "0",
        secret: false,
        doc: "Docker computers each API process keeps created and started ahead, each with the spare desktops of SANDBOX_DESKTOP_WARM_STACKS (set both for a computer whose first screenshot comes in about a second): a new computer whose home is empty claims one (its home directory and name become the computer's) instead of creating its container; a computer restored into a home that holds files is created as before. The pool refills in the background; each pooled computer holds its container and spares (about 200 MiB PSS per spare desktop) and is listed under warmDesktops in health. The supervisor removes a pool whose process stopped (90 s without renewal). A claimed container keeps the labels it was created with (rakazo.poolOwner, no rakazo.botId or rakazo.workspaceId) and its mount names the pool home, now a link to the computer's home: find it by name; the supervisor's claim record gives its computer. 0, the default: none.",
    },
    Var {
        name: "SANDBOX_EGRESS_GUARD",
        default: "on",
        secret: false,
        doc: "Egress guard of bridged docker computers: on (computers join the supervisor's own network; its firewall rules refuse private, link-local, carrier-grade NAT, loopback and multicast destinations, the host itself and other computers; creates are refused while the rules cannot be installed) or off.",
    },
    Var {
        name: "SANDBOX_EGRESS_ALLOW",
        default: "",
        secret: false,
        doc: "Destinations opened despite the egress guard: comma-separated CIDR, CIDR:PORT or CIDR:LOW-HIGH ([v6-CIDR]:PORT for IPv6 with ports). A private DNS resolver (for instance a cloud's 169.254.169.253:53) must be listed here.",
    },
    Var {
        name: "SANDBOX_EGRESS_NETWORK",
        default: "rakazo-computers",
        secret: false,
        doc: "Name of the Docker network the supervisor owns for guarded computers (its bridge and firewall chains are named from it).",
    },
    Var {
        name: "KUBERNETES_NAMESPACE",
        default: "rakazo-sandboxes",
        secret: false,
        doc: "Namespace of kubernetes computer pods. The API and worker reach the cluster with their service account, or the kubeconfig in KUBECONFIG.",
    },
    Var {
        name: "KUBECONFIG",
        default: "",
        secret: false,
        doc: "Kubeconfig file of the kubernetes provider. Unset: the pod's service account in a cluster, else ~/.kube/config.",
    },
    Var {
        name: "RAKAZO_COMPUTER_IMAGE",
        default: "",
        secret: false,
        doc: "Computer image of kubernetes computers, as the cluster pulls it. Unset: rakazo-computer:<hash of the built-in recipe>.",
    },
    Var {
        name: "RAKAZO_COMPUTER_IMAGE_TAG",
        default: "",
        secret: false,
        doc: "Tag of RAKAZO_COMPUTER_IMAGE (unset: the image reference is used as given).",
    },
    Var {
        name: "KUBERNETES_SANDBOX_CPU_REQUEST",
        default: "500m",
        secret: false,
        doc: "CPU request of each kubernetes computer pod, as a Kubernetes quantity (empty = none).",
    },
    Var {
        name: "KUBERNETES_SANDBOX_CPU_LIMIT",
        default: "2",
        secret: false,
        doc: "CPU limit of each kubernetes computer pod (empty = none).",
    },
    Var {
        name: "KUBERNETES_SANDBOX_MEMORY_REQUEST",
        default: "1Gi",
        secret: false,
        doc: "Memory request of each kubernetes computer pod (empty = none).",
    },
    Var {
        name: "KUBERNETES_SANDBOX_MEMORY_LIMIT",
        default: "4Gi",
        secret: false,
        doc: "Memory limit of each kubernetes computer pod (empty = none).",
    },
    Var {
        name: "KUBERNETES_SANDBOX_HOME_CLAIM",
        default: "",
        secret: false,
        doc: "The PersistentVolumeClaim that holds DATA_DIR, in the computers' namespace: kubernetes computers mount homes/<home key> from it at their workspace instead of copying their home in and out through pods/exec. Needs both KUBERNETES_SANDBOX_HOME_COLOCATE_* variables. Ignored (homes are copied) when OBJECT_STORAGE_BUCKET is set.",
    },
    Var {
        name: "KUBERNETES_SANDBOX_HOME_COLOCATE_NAMESPACE",
        default: "",
        secret: false,
        doc: "With KUBERNETES_SANDBOX_HOME_CLAIM: the namespace of the pods that hold the claim's volume (the API's).",
    },
    Var {
        name: "KUBERNETES_SANDBOX_HOME_COLOCATE_LABELS",
        default: "",
        secret: false,
        doc: "With KUBERNETES_SANDBOX_HOME_CLAIM: the labels of those pods as a JSON object, for example {\"app\":\"rakazo-api\"}; computer pods get a required pod affinity to them (a ReadWriteOnce volume is attached to one node).",
    },
    Var {
        name: "SCREEN_CAPABILITY_SECRET",
        default: "",
        secret: true,
        doc: "64 hex characters (32 bytes) sealing screen capabilities. Unset: generated once and kept in DATA_DIR/screen-capability.key.",
    },
    Var {
        name: "RAKAZO_INTERNAL_TOKEN",
        default: "",
        secret: true,
        doc: "64 hex characters (32 bytes): the bearer credential of internal endpoints (`/internal/screen-authority`, for a screen proxy in another process). API tokens are never accepted there. Unset: generated once and kept in DATA_DIR/internal-token.",
    },
    Var {
        name: "SCREEN_NOVNC_DIR",
        default: "/usr/share/novnc",
        secret: false,
        doc: "Directory of noVNC's files (Debian's novnc package), read at startup; the screen proxy serves the viewer from it, never from a computer. Missing: screens answer viewer_missing and /internal/health says so.",
    },
    Var {
        name: "CONTENT_ENCRYPTION_KEY",
        default: "",
        secret: true,
        doc: "64 hex characters (32 bytes): the master key wrapping every space's content key, which wraps each workspace's data key. Unset: generated once and kept in DATA_DIR/content.key. Keep a copy off the host: without it no checkpoint opens.",
    },
    Var {
        name: "OBJECT_STORAGE_BUCKET",
        default: "",
        secret: false,
        doc: "S3-compatible bucket holding sealed workspace checkpoints; unset keeps checkpoints under DATA_DIR.",
    },
    Var {
        name: "OBJECT_STORAGE_ENDPOINT",
        default: "",
        secret: false,
        doc: "Endpoint URL of the S3-compatible service (unset = AWS).",
    },
    Var {
        name: "OBJECT_STORAGE_REGION",
        default: "us-east-1",
        secret: false,
        doc: "Region of the bucket.",
    },
    Var {
        name: "OBJECT_STORAGE_ACCESS_KEY_ID",
        default: "",
        secret: true,
        doc: "Access key id for the bucket.",
    },
    Var {
        name: "OBJECT_STORAGE_SECRET_ACCESS_KEY",
        default: "",
        secret: true,
        doc: "Secret access key for the bucket.",
    },
    Var {
        name: "OBJECT_STORAGE_PREFIX",
        default: "",
        secret: false,
        doc: "Key prefix in the bucket (segments of letters, digits, '-', '_', '.'); this deployment's objects live under <prefix>/<deployment id>/, where the deployment id is made once in the database.",
    },
    Var {
        name: "HOME_REVISIONS_KEEP",
        default: "3",
        secret: false,
        doc: "How many checkpoint revisions of each workspace are kept (at least 1).",
    },
    Var {
        name: "RECORDING_RETENTION_DAYS",
        default: "30",
        secret: false,
        doc: "Days a run's recording (the frames its bot saw and its actions) is kept; 0 records no runs.",
    },
    Var {
        name: "RECORDING_MAX_RUN_BYTES",
        default: "268435456",
        secret: false,
        doc: "Sealed frame bytes kept per run; once reached, later steps are recorded without their frames.",
    },
    Var {
        name: "RECORD_CONTROL_SESSIONS",
        default: "false",
        secret: false,
        doc: "Record the screen of people's control sessions (a frame a second while it changes, sealed, kept and capped like run recordings; typed text is never stored as text). Off: a session is noted with its input counts only.",
    },
];

/// The annotated example environment file (`config/rakazo.env.example`).
pub fn render_example() -> String {
    let mut out = String::from(
        "# Rakazo Runtime configuration: every variable, its default and what it accepts.\n\
         # Generated by `rakazo config example`; a test keeps it equal to the code.\n\
         # Each variable may also be set in a TOML file (`rakazo serve --config FILE`) under\n\
         # its lower-case name; the environment wins over the file, the file over defaults.\n",
    );
    for var in VARS {
        out.push('\n');
        for line in wrap(var.doc, 96) {
            out.push_str("# ");
            out.push_str(&line);
            out.push('\n');
        }
        if var.secret {
            out.push_str("# (secret: never logged)\n");
        }
        if var.default.is_empty() {
            out.push_str(&format!("# {}=\n", var.name));
        } else {
            out.push_str(&format!("{}={}\n", var.name, var.default));
        }
    }
    out
}

fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut lines = vec![String::new()];
    for word in text.split_whitespace() {
        let last = lines.last_mut().expect("one line");
        if !last.is_empty() && last.len() + 1 + word.len() > width {
            lines.push(word.to_owned());
        } else {
            if !last.is_empty() {
                last.push(' ');
            }
            last.push_str(word);
        }
    }
    lines
}
