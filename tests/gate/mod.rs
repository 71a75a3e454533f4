//! The one test gate: a test that needs a part of the machine (the Postgres server, the S3
//! server, a Docker engine and the computer image, Chromium) fails when the part is missing,
//! saying what is missing and how to get it. Only `RAKAZO_TEST_SKIP_MISSING=1` turns that into
//! a noted skip; `scripts/test.sh`, which installs and starts every part, never sets it.
#![allow(dead_code)]

/// The opt-out variable.
pub const SKIP_MISSING: &str = "RAKAZO_TEST_SKIP_MISSING";

/// `part` is missing: fail the test naming it and `how` to get it, or, under
/// `RAKAZO_TEST_SKIP_MISSING=1`, note the skip and return (the caller then returns).
#[track_caller]
pub fn missing(part: &str, how: &str) {
    if std::env::var(SKIP_MISSING).as_deref() == Ok("1") {
        eprintln!("skipped ({SKIP_MISSING}=1): {part} is missing; {how}");
        return;
    }
    panic!("{part} is missing: {how} (or set {SKIP_MISSING}=1 to skip the tests that need it)");
}

/// How to get the Postgres server.
pub const POSTGRES: &str =
    "scripts/test.sh installs and starts one and sets RAKAZO_TEST_POSTGRES_URL";
/// How to get the S3 server.
pub const S3: &str = "scripts/test.sh starts a moto S3 server and sets RAKAZO_TEST_S3_ENDPOINT";
/// How to get Chromium.
pub const CHROMIUM: &str = "scripts/test.sh installs it (scripts/install-desktop-deps.sh)";
