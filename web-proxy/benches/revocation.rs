//! Revocation latency: over 50 revocations (control released, slot reused, bot stopped) while
//! the upstream sends frames without pause, the time from the revocation to the close frame
//! and to the end of the browser's connection; baseline: a close the browser starts itself on
//! the same proxy (close frame out, until the connection ends). Run side by side on a server
//! without `rakazo_web_proxy::on_connect` (baseline: the connection lingers) and with it.
//!
//! Run with `cargo bench -p rakazo-web-proxy --bench revocation` (`--profile dev` for the
//! unoptimized build).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt as _, StreamExt as _};
use rakazo_web_proxy::capability::{Keyring, Policy};
use rakazo_web_proxy::gateway::{RevokeControl, RevokeSlot};
use tokio_tungstenite::tungstenite::Message;

const TOKEN: &str = "flood-sock3t_for-bench";
const ROUNDS: u64 = 50;

fn pct(samples: &mut [Duration], p: f64) -> f64 {
    samples.sort();
    let i = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[i].as_secs_f64() * 1000.0
}

/// Reads until the close frame (its time), then until the connection ends (its time).
async fn close_times(ws: &mut Client, from: Instant) -> (Duration, Duration) {
    let frame = loop {
        match ws.next().await {
            Some(Ok(Message::Close(_))) => break from.elapsed(),
            Some(Ok(_)) => {}
            _ => break from.elapsed(),
        }
    };
    while let Some(Ok(_)) = ws.next().await {}
    (frame, from.elapsed())
}

/// Close times of one proxy: revoked sockets' close frames and connection ends, and the
/// browser's own closes.
struct Figures {
    frames: Vec<Duration>,
    ends: Vec<Duration>,
    own: Vec<Duration>,
}

/// 50 revocations through a proxy that keeps its connections' sockets (`on_connect`, as the
/// servers run it) or not (`lingering`: connections end after actix-http's linger).
async fn revocations(lingering: bool) -> Figures {
    let (upstream, _) = start_fake_gateway(TOKEN);
    let authority = TestAuthority::new(&format!("http://{upstream}"), TOKEN);
    let keyring = Arc::new(Keyring::random(1));
    let (proxy, gateway) = if lingering {
        start_proxy_lingering(keyring.clone(), Arc::new(authority.clone()))
    } else {
        start_proxy(keyring.clone(), Arc::new(authority.clone()))
    };
    let seal = |policy, generation, fence| {
        keyring
            .seal(&capability(policy, generation, fence))
            .unwrap()
    };
    let mut figures = Figures {
        frames: Vec::new(),
        ends: Vec::new(),
        own: Vec::new(),
    };
    for round in 0..ROUNDS {
        let (generation, fence) = (round + 1, round + 1);
        authority.update(|l| {
            l.generation = generation;
            l.control_fence = Some(fence);
        });
        let mut control = connect(proxy, &seal(Policy::Control, generation, fence))
            .await
            .unwrap();
        let mut view = connect(proxy, &seal(Policy::View, generation, 0))
            .await
            .unwrap();
        for ws in [&mut control, &mut view] {
            next_binary(ws).await;
            next_binary(ws).await;
        }
        let release = RevokeControl {
            computer_id: COMPUTER.into(),
            bot_id: BOT.into(),
            fence,
        };
        let reuse = RevokeSlot {
            computer_id: COMPUTER.into(),
            slot: SLOT,
            generation,
        };
        let started = Instant::now();
        let revoked: Vec<&mut Client> = match round % 3 {
            0 => {
                authority.update(|l| l.control_fence = None);
                let g = gateway.clone();
                actix_rt::spawn(async move { g.send(release).await });
                vec![&mut control]
            }
            1 => {
                authority.update(|l| l.generation = generation + 1);
                let g = gateway.clone();
                actix_rt::spawn(async move { g.send(reuse).await });
                vec![&mut control, &mut view]
            }
            _ => {
                authority.update(|l| {
                    l.control_fence = None;
                    l.generation = generation + 1;
                });
                let g = gateway.clone();
                // Both at once, as the revocation watcher sends a bot stop's.
                actix_rt::spawn(async move {
                    let _ = futures_util::future::join(g.send(release), g.send(reuse)).await;
                });
                vec![&mut control, &mut view]
            }
        };
        // Every revoked socket read at once, as each browser reads its own.
        let times =
            futures_util::future::join_all(revoked.into_iter().map(|ws| close_times(ws, started)))
                .await;
        for (frame, end) in times {
            figures.frames.push(frame);
            figures.ends.push(end);
        }
        if round % 3 == 0 {
            // Baseline: the browser closes the surviving view itself.
            let started = Instant::now();
            view.send(Message::Close(None)).await.unwrap();
            while let Some(Ok(_)) = view.next().await {}
            figures.own.push(started.elapsed());
        }
    }
    figures
}

fn report(name: &str, mut f: Figures) {
    println!(
        "{name}: revocation over {} sockets ({ROUNDS} revocations, upstream flooding)",
        f.frames.len()
    );
    println!(
        "  close frame:     p50 {:.1} ms, p95 {:.1} ms, p100 {:.1} ms",
        pct(&mut f.frames, 0.5),
        pct(&mut f.frames, 0.95),
        pct(&mut f.frames, 1.0)
    );
    println!(
        "  connection end:  p50 {:.1} ms, p95 {:.1} ms, p100 {:.1} ms",
        pct(&mut f.ends, 0.5),
        pct(&mut f.ends, 0.95),
        pct(&mut f.ends, 1.0)
    );
    println!(
        "  the browser's own close, to connection end ({} closes): p50 {:.1} ms, p95 {:.1} ms, p100 {:.1} ms",
        f.own.len(),
        pct(&mut f.own, 0.5),
        pct(&mut f.own, 0.95),
        pct(&mut f.own, 1.0)
    );
}

fn main() {
    actix_rt::System::new().block_on(async {
        assert!(TOKEN.starts_with(FLOOD_PREFIX));
        // Side by side: the server without `on_connect` (the connection lingers after the
        // response) first, then with it.
        let lingering = revocations(true).await;
        let ended = revocations(false).await;
        report(
            "baseline, without on_connect (actix-http lingers)",
            lingering,
        );
        report("with on_connect (the relay ends the connection)", ended);
    });
}
