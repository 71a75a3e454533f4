//! What shows that a machine's scripts go through its exec agent listening behind the screen
//! gateway (Novita, Daytona, Box): the parent of a script, and a wait for it.

use std::time::{Duration, Instant};

use rakazo_actors::conformance::cmd;
use rakazo_actors::provider::{ProviderRef, SandboxProvider};

/// The command line of a script's parent: the listening agent's when the script went through
/// it (an emulator's own machine may run the supervisor's agent too, whose source names
/// `--listen`).
pub const PARENT: &str = "tr '\\0' ' ' < /proc/$PPID/cmdline";
/// What the listening agent's command line has and no other's.
pub const LISTENING: &str = "rakazo-exec-agent --listen";
/// The listening agent, found by its command line (`[a]`: not the script that looks for it).
pub const AGENT: &str = "^python3 .*rakazo-exec-[a]gent --listen";

/// Whether a shell command goes through the listening agent within 30 s of tries.
pub async fn scripts_reach_it(p: &dyn SandboxProvider, m: &ProviderRef) -> bool {
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until {
        if p.exec(m, &cmd(PARENT))
            .await
            .unwrap()
            .stdout
            .contains(LISTENING)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    false
}
