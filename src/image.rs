//! The computer image: its recipe (built into the binary), its tag, and `rakazo image build`.
//!
//! The recipe is `config/computer-image/packages.txt` (Debian packages) and `setup.sh` (run in
//! the new root: the uid-1000 user, cleanup). The tag is `rakazo-computer:` and the first 16
//! hex digits of `sha256(packages.txt ++ setup.sh)`, the same digest
//! `scripts/build-computer-image.sh` computes, so a changed recipe gives a new tag and an
//! unchanged one is built once. The build runs `mmdebstrap --mode=root --variant=apt` of
//! bookworm into a tarball and imports it with `docker import`; nothing is pulled.

use std::path::Path;
use std::process::Command;

use sha2::{Digest, Sha256};

/// The package list of the recipe.
pub const PACKAGES: &str = include_str!("../config/computer-image/packages.txt");
/// The setup script of the recipe.
pub const SETUP: &str = include_str!("../config/computer-image/setup.sh");
/// Repository of the image.
pub const REPOSITORY: &str = "rakazo-computer";

/// The image reference of the built-in recipe: `rakazo-computer:<hash>`.
pub fn default_image() -> String {
    let digest = Sha256::new()
        .chain_update(PACKAGES.as_bytes())
        .chain_update(SETUP.as_bytes())
        .finalize();
    let hex = hex::encode(digest);
    format!("{REPOSITORY}:{}", &hex[..16])
}

/// The packages of the recipe, comments and blank lines dropped.
pub fn packages() -> Vec<&'static str> {
    PACKAGES
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect()
}

/// Failures of an image build.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// A build step could not run or failed.
    #[error("{step}: {reason}")]
    Step {
        /// Which step.
        step: &'static str,
        /// Why.
        reason: String,
    },
}

fn run(step: &'static str, cmd: &mut Command) -> Result<std::process::Output, ImageError> {
    let out = cmd.output().map_err(|e| ImageError::Step {
        step,
        reason: e.to_string(),
    })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = stderr.lines().rev().take(8).collect();
        return Err(ImageError::Step {
            step,
            reason: tail.into_iter().rev().collect::<Vec<_>>().join("\n"),
        });
    }
    Ok(out)
}

/// Whether the engine already has `image`.
pub fn exists(image: &str) -> bool {
    Command::new("docker")
        .args(["image", "inspect", image])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Builds the built-in recipe's image unless its tag exists; returns the image reference
/// and whether it was built now.
pub fn build(work_dir: &Path) -> Result<(String, bool), ImageError> {
    let image = default_image();
    if exists(&image) {
        return Ok((image, false));
    }
    let step = |reason: std::io::Error| ImageError::Step {
        step: "work directory",
        reason: reason.to_string(),
    };
    let work = tempfile::Builder::new()
        .prefix("rakazo-image-")
        .tempdir_in(work_dir)
        .map_err(step)?;
    let setup = work.path().join("setup.sh");
    std::fs::write(&setup, SETUP).map_err(step)?;
    let tarball = work.path().join("rootfs.tar");
    tracing::info!(image = %image, "image.build.started");
    let started = std::time::Instant::now();
    run(
        "mmdebstrap",
        Command::new("mmdebstrap")
            .args(["--quiet", "--mode=root", "--variant=apt"])
            .arg("--aptopt=APT::Install-Recommends \"false\"")
            .arg("--dpkgopt=path-exclude=/usr/share/doc/*")
            .arg("--dpkgopt=path-exclude=/usr/share/man/*")
            .arg("--dpkgopt=path-exclude=/usr/share/locale/*")
            .arg("--dpkgopt=path-include=/usr/share/locale/locale.alias")
            .arg(format!("--include={}", packages().join(",")))
            .arg(format!(
                "--customize-hook=chroot \"$1\" sh -s < '{}'",
                setup.display()
            ))
            .arg("bookworm")
            .arg(&tarball),
    )?;
    run(
        "docker import",
        Command::new("docker")
            .arg("import")
            .args(["--change", "USER 1000:1000"])
            .args(["--change", "WORKDIR /home/rakazo"])
            .args([
                "--change",
                "ENV PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 HOME=/home/rakazo",
            ])
            .args(["--change", "CMD [\"sleep\", \"infinity\"]"])
            .arg("--message")
            .arg(format!("rakazo computer image {image}"))
            .arg(&tarball)
            .arg(&image),
    )?;
    tracing::info!(image = %image, elapsed_ms = started.elapsed().as_millis() as u64, "image.build.finished");
    Ok((image, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_is_the_recipe_hash_the_script_computes() {
        let image = default_image();
        let (repo, tag) = image.split_once(':').unwrap();
        assert_eq!(repo, REPOSITORY);
        assert_eq!(tag.len(), 16);
        assert!(tag.bytes().all(|b| b.is_ascii_hexdigit()));
        // The same digest as `cat packages.txt setup.sh | sha256sum | cut -c1-16`.
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/computer-image");
        let mut joined = std::fs::read(root.join("packages.txt")).unwrap();
        joined.extend(std::fs::read(root.join("setup.sh")).unwrap());
        let hex = hex::encode(Sha256::digest(&joined));
        assert_eq!(tag, &hex[..16]);
    }

    #[test]
    fn the_desktop_stack_is_in_the_recipe() {
        let p = packages();
        for needed in [
            "xvfb",
            "fluxbox",
            "x11vnc",
            "websockify",
            "novnc",
            "chromium",
            "xdotool",
            "python3",
            "procps",
        ] {
            assert!(p.contains(&needed), "{needed} missing");
        }
    }
}
