//! Pooled Docker computers (`SANDBOX_DOCKER_WARM_COMPUTERS`): a new computer claims a
//! container created ahead, with the browser of its spare desktop already running; the claim
//! gives it the computer's name, labels and home, through restarts; a home that holds files
//! is never claimed into; the pool refills, and goes with its process.

use std::path::Path;
use std::time::{Duration, Instant};

use rakazo::config::DockerNetwork;
use rakazo::providers::docker::client::SupervisorClient;
use rakazo::supervisor::wire::CreateComputer;
use rakazo_actors::provider::{MachineSpec, ProviderError, SandboxProvider};

use super::docker_support::{TestSupervisor, docker_ready};
use super::team_screens::unique;

/// The pool homes under `data_dir` (`homes/.pool-<hex>`) that are directories: one per
/// unclaimed pooled computer.
fn pool_homes(data_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(data_dir.join("homes"))
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(".pool-"))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Waits until the provider has `n` pooled computers ready, each with its spare desktop
/// started and measured.
async fn pool_ready(p: &rakazo::providers::docker::DockerProvider, n: usize) {
    let started = Instant::now();
    loop {
        let w = p.warm_desktops().await.expect("a pool is configured");
        if w.pooled_ready >= n && w.ready >= n && w.pss_kib > 0 {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the pool never filled: {w:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn spec(bot: &str, home: &str) -> MachineSpec {
    MachineSpec {
        computer_id: unique("c"),
        space_id: unique("s"),
        bot_id: Some(bot.into()),
        home_key: home.into(),
    }
}

#[actix_rt::test]
async fn a_new_computer_claims_a_pooled_one_with_its_browser_running() {
    if !docker_ready() {
        return;
    }
    // A desktop that did not take the spare's browser says why (`desktop.warm.*`).
    super::common::capture_logs();
    let sup = TestSupervisor::start(DockerNetwork::None);
    let p = sup.pooled_provider(1, 1);
    p.start_pool();
    pool_ready(&p, 1).await;
    let [pooled_home] = pool_homes(&sup.data_dir).try_into().expect("one pool home");

    let bot = unique("b");
    let home = unique("h");
    let s = spec(&bot, &home);
    let m = p.provision(&s).await.expect("provision");
    let info = p.info(&m).await.unwrap();
    assert_eq!(
        info.name,
        format!("rakazo-bot-{bot}"),
        "renamed to the computer's"
    );
    assert_eq!(
        (info.computer_id.as_str(), info.space_id.as_str()),
        (s.computer_id.as_str(), s.space_id.as_str())
    );
    assert_eq!(
        (info.bot_id.as_str(), info.home_key.as_str()),
        (bot.as_str(), home.as_str())
    );
    let homes = sup.data_dir.join("homes");
    assert_eq!(Path::new(&info.home_dir), homes.join(&home));
    let link = std::fs::read_link(homes.join(&pooled_home)).expect("a link at the pool home");
    assert_eq!(link, Path::new(&home));
    let client = SupervisorClient::new(&sup.url, &sup.token).unwrap();
    assert_eq!(
        client.find(&home).await.unwrap().id,
        m.0,
        "found by its home"
    );

    // The first desktop takes the spare's running browser: its profile became the bot's,
    // with a link at the spare's name while the desktop lives (the spare started as a refill
    // two seconds after the desktop was up, on a busy machine before this look, is a folder).
    p.open_screen(&m, &bot, 0).await.expect("open screen");
    let frame = p.observe(&m, &bot).await.expect("observe");
    assert!(frame.png.starts_with(b"\x89PNG"));
    let profiles = homes.join(&home).join(".browser-profiles");
    assert!(profiles.join(&bot).is_dir());
    let spare_links: Vec<_> = std::fs::read_dir(&profiles)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".spare-"))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_symlink()))
        .map(|e| std::fs::read_link(e.path()).unwrap())
        .collect();
    let listed: Vec<_> = std::fs::read_dir(&profiles)
        .unwrap()
        .flatten()
        .map(|e| (e.file_name(), e.file_type().is_ok_and(|t| t.is_symlink())))
        .collect();
    assert_eq!(
        spare_links.len(),
        1,
        "profiles (name, is a link): {listed:?}"
    );
    assert_eq!(spare_links[0].file_name(), Some(std::ffi::OsStr::new(&bot)));

    // Files written in the computer are in its home, through a restart of the container.
    p.write_file(&m, "note.txt", b"kept").await.unwrap();
    assert_eq!(
        std::fs::read(homes.join(&home).join("note.txt")).unwrap(),
        b"kept"
    );
    p.stop(&m).await.unwrap();
    p.reconnect(&m, &s)
        .await
        .expect("started again through the link");
    let out = p
        .exec(
            &m,
            &rakazo_actors::provider::ExecRequest {
                command: "cat note.txt; echo; ls -a ~ | grep -c pool || true".into(),
                cwd: String::new(),
                env: vec![],
                timeout: Duration::from_secs(20),
            },
        )
        .await
        .unwrap();
    assert_eq!(out.stdout.trim(), "kept\n0", "{out:?}");

    // The pool refilled with another computer.
    pool_ready(&p, 1).await;
    let [refilled] = pool_homes(&sup.data_dir).try_into().expect("one pool home");
    assert_ne!(refilled, pooled_home);

    // A computer restored into a home that holds files is created, not claimed: nothing of
    // the pool reaches that home, and the pooled computer stays.
    let other_bot = unique("b");
    let other_home = unique("h");
    std::fs::create_dir_all(homes.join(&other_home)).unwrap();
    std::fs::write(homes.join(&other_home).join("restored.txt"), b"mine").unwrap();
    let other = p.provision(&spec(&other_bot, &other_home)).await.unwrap();
    assert_eq!(
        p.read_file(&other, "restored.txt").await.unwrap(),
        b"mine".to_vec()
    );
    let names: Vec<String> = std::fs::read_dir(homes.join(&other_home))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        vec!["restored.txt".to_string()],
        "nothing of the pool"
    );
    assert_eq!(pool_homes(&sup.data_dir), vec![refilled.clone()]);
    assert_eq!(p.warm_desktops().await.unwrap().pooled_ready, 1);

    // A computer in use is not claimed again.
    let again = client
        .claim(
            &m.0,
            &CreateComputer {
                computer_id: unique("c"),
                space_id: unique("s"),
                bot_id: Some(unique("b")),
                home_key: unique("h"),
                account: None,
            },
        )
        .await;
    assert!(again.is_err(), "{again:?}");

    // Destroyed: the link goes, the home stays (it is the durable workspace).
    p.destroy(&m).await.unwrap();
    assert!(std::fs::symlink_metadata(homes.join(&pooled_home)).is_err());
    assert!(homes.join(&home).join("note.txt").is_file());

    // The process stops: its pooled computers and their homes go.
    p.shutdown().await.unwrap();
    assert!(pool_homes(&sup.data_dir).is_empty());
    let left = std::process::Command::new("docker")
        .args(["ps", "-aq", "--filter"])
        .arg(format!("label=rakazo.homeKey={refilled}"))
        .output()
        .unwrap();
    assert!(left.stdout.is_empty(), "the pooled container was removed");
    p.destroy(&other).await.unwrap();
    assert!(matches!(
        client.inspect(&m.0).await,
        Err(ProviderError::MachineGone)
    ));
}

#[actix_rt::test]
async fn pools_of_owners_that_stopped_renewing_are_removed_claimed_computers_never() {
    if !docker_ready() {
        return;
    }
    let sup = TestSupervisor::start(DockerNetwork::None);
    let engine = sup.engine().await;
    let (alive, gone) = (unique("alive"), unique("gone"));
    let kept = engine.create_pooled(&alive).await.unwrap();
    let dropped = engine.create_pooled(&gone).await.unwrap();
    let claimed = engine.create_pooled(&gone).await.unwrap();
    let home = unique("h");
    let req = CreateComputer {
        computer_id: unique("c"),
        space_id: unique("s"),
        bot_id: None,
        home_key: home.clone(),
        account: None,
    };
    let claimed = engine.claim(&claimed.id, &req).await.unwrap();
    assert_eq!(claimed.name, format!("rakazo-home-{home}"));
    assert!(
        engine.claim(&claimed.id, &req).await.is_err(),
        "claimed once"
    );
    assert!(
        engine
            .claim(
                &kept.id,
                &CreateComputer {
                    account: Some("user".into()),
                    ..req.clone()
                }
            )
            .await
            .is_err(),
        "a pooled computer has no vendor account"
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(
        engine.renew_pool(&alive).await.unwrap(),
        vec![kept.id.clone()],
        "an owner hears of its own unclaimed computers"
    );
    assert_eq!(
        engine.renew_pool(&gone).await.unwrap(),
        vec![dropped.id.clone()],
        "not of claimed ones"
    );
    // `gone` stops renewing from here.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    engine.renew_pool(&alive).await.unwrap();
    assert_eq!(engine.reap_pool(Duration::from_secs(1)).await.unwrap(), 1);
    assert!(matches!(
        engine.inspect(&dropped.id).await,
        Err(rakazo::supervisor::engine::EngineError::Gone)
    ));
    assert!(
        !Path::new(&dropped.home_dir).exists(),
        "its pool home went with it"
    );
    assert!(engine.inspect(&kept.id).await.unwrap().running);
    assert_eq!(engine.inspect(&claimed.id).await.unwrap().home_key, home);
    assert_eq!(pool_homes(&sup.data_dir).len(), 1, "the kept one's");
    for id in [&kept.id, &claimed.id] {
        engine.remove(id).await.unwrap();
    }
    assert!(pool_homes(&sup.data_dir).is_empty());
}
