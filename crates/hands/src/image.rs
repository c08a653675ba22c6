//! The default sandbox image, built locally: no registry is reachable on our machines. It
//! is a root filesystem imported from a tarball made here: Debian's static busybox with a
//! link per applet, `/etc/passwd`, an empty `/workspace` and `/tmp`. The executor binary is
//! not baked in; it is bind-mounted read-only at run time, so any user image works too.

use std::path::{Path, PathBuf};

use bollard::Docker;
use bollard::query_parameters::CreateImageOptionsBuilder;
use futures_util::StreamExt;

use crate::HandsError;

/// The image `nerve run` uses unless `--image` says otherwise.
pub const DEFAULT_IMAGE: &str = "nerve-sandbox:latest";

/// Where the busybox for the default image comes from.
#[derive(Debug, Clone)]
pub struct ImageSource {
    /// A statically linked busybox (Debian's `busybox-static` installs `/bin/busybox`).
    pub busybox: PathBuf,
}

impl Default for ImageSource {
    fn default() -> Self {
        Self {
            busybox: PathBuf::from("/bin/busybox"),
        }
    }
}

/// Whether `image` exists in the local engine.
pub async fn image_exists(docker: &Docker, image: &str) -> Result<bool, HandsError> {
    match docker.inspect_image(image).await {
        Ok(_) => Ok(true),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(false),
        Err(other) => Err(other.into()),
    }
}

/// Builds (or rebuilds) `tag` from `source` by importing a root filesystem tarball.
pub async fn build_default_image(
    docker: &Docker,
    source: &ImageSource,
    tag: &str,
) -> Result<(), HandsError> {
    let tarball = rootfs_tarball(&source.busybox)?;
    let (repo, version) = tag.rsplit_once(':').unwrap_or((tag, "latest"));
    let options = CreateImageOptionsBuilder::default()
        .from_src("-")
        .repo(repo)
        .tag(version)
        .changes(vec![
            "ENV PATH=/bin:/usr/bin".to_owned(),
            "WORKDIR /workspace".to_owned(),
            "LABEL org.nerve.image=sandbox".to_owned(),
        ])
        .build();
    let mut progress = docker.create_image(
        Some(options),
        Some(bollard::body_full(tarball.into())),
        None,
    );
    while let Some(step) = progress.next().await {
        let step = step?;
        if let Some(error) = step.error_detail.and_then(|detail| detail.message) {
            return Err(HandsError::ImageBuild(error));
        }
    }
    Ok(())
}

fn rootfs_tarball(busybox: &Path) -> Result<Vec<u8>, HandsError> {
    let binary = std::fs::read(busybox).map_err(|e| {
        HandsError::ImageBuild(format!(
            "cannot read {} ({e}); install Debian's busybox-static (apt-get install busybox-static)",
            busybox.display()
        ))
    })?;
    if !is_static_elf(&binary) {
        return Err(HandsError::ImageBuild(format!(
            "{} is dynamically linked and cannot run in a FROM-scratch image; install busybox-static",
            busybox.display()
        )));
    }
    let applets = list_applets(busybox)?;
    let mut builder = tar::Builder::new(Vec::new());
    let io =
        |e: std::io::Error| HandsError::ImageBuild(format!("cannot write the image tarball: {e}"));
    for dir in [
        "bin",
        "usr",
        "usr/bin",
        "etc",
        "tmp",
        "workspace",
        "opt",
        "opt/nerve",
        "proc",
        "dev",
        "sys",
    ] {
        let mode = if dir == "tmp" { 0o1777 } else { 0o755 };
        append_entry(
            &mut builder,
            tar::EntryType::Directory,
            dir,
            mode,
            &[],
            None,
        )
        .map_err(io)?;
    }
    append_entry(
        &mut builder,
        tar::EntryType::Regular,
        "bin/busybox",
        0o755,
        &binary,
        None,
    )
    .map_err(io)?;
    for applet in applets.iter().filter(|a| a.as_str() != "busybox") {
        append_entry(
            &mut builder,
            tar::EntryType::Symlink,
            &format!("bin/{applet}"),
            0o777,
            &[],
            Some("busybox"),
        )
        .map_err(io)?;
    }
    append_entry(
        &mut builder,
        tar::EntryType::Symlink,
        "usr/bin/env",
        0o777,
        &[],
        Some("/bin/busybox"),
    )
    .map_err(io)?;
    let passwd = b"root:x:0:0:root:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/tmp:/bin/sh\n";
    append_entry(
        &mut builder,
        tar::EntryType::Regular,
        "etc/passwd",
        0o644,
        passwd,
        None,
    )
    .map_err(io)?;
    let group = b"root:x:0:\nnogroup:x:65534:\n";
    append_entry(
        &mut builder,
        tar::EntryType::Regular,
        "etc/group",
        0o644,
        group,
        None,
    )
    .map_err(io)?;
    builder.into_inner().map_err(io)
}

fn append_entry(
    builder: &mut tar::Builder<Vec<u8>>,
    kind: tar::EntryType,
    path: &str,
    mode: u32,
    data: &[u8],
    link: Option<&str>,
) -> std::io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(data.len() as u64);
    match link {
        Some(target) => builder.append_link(&mut header, path, target),
        None => builder.append_data(&mut header, path, data),
    }
}

/// A static ELF has no `PT_INTERP` program header (no dynamic loader).
pub(crate) fn is_static_elf(binary: &[u8]) -> bool {
    const PT_INTERP: u32 = 3;
    let read_u16 = |at: usize| {
        binary
            .get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let read_u32 = |at: usize| {
        binary
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let read_u64 = |at: usize| {
        binary
            .get(at..at + 8)
            .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
    };
    // Only 64-bit little-endian ELF is supported (the sandbox runs x86_64).
    if binary.get(0..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1]) {
        return false;
    }
    let (Some(phoff), Some(phentsize), Some(phnum)) =
        (read_u64(0x20), read_u16(0x36), read_u16(0x38))
    else {
        return false;
    };
    let Ok(phoff) = usize::try_from(phoff) else {
        return false;
    };
    (0..usize::from(phnum))
        .all(|i| read_u32(phoff + i * usize::from(phentsize)).is_some_and(|kind| kind != PT_INTERP))
}

fn list_applets(busybox: &Path) -> Result<Vec<String>, HandsError> {
    let output = std::process::Command::new(busybox)
        .arg("--list")
        .output()
        .map_err(|e| {
            HandsError::ImageBuild(format!("cannot run {} --list: {e}", busybox.display()))
        })?;
    if !output.status.success() {
        return Err(HandsError::ImageBuild(format!(
            "{} --list failed",
            busybox.display()
        )));
    }
    let applets: Vec<String> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::trim)
        .filter(|name| {
            !name.is_empty()
                && name.chars().all(|c| {
                    c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' || c == '['
                })
        })
        .map(str::to_owned)
        .collect();
    if applets.iter().any(|a| a == "sh") {
        Ok(applets)
    } else {
        Err(HandsError::ImageBuild(format!(
            "{} has no `sh` applet",
            busybox.display()
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_detection() {
        let busybox = Path::new("/bin/busybox");
        if busybox.exists() {
            assert!(
                is_static_elf(&std::fs::read(busybox).unwrap()),
                "busybox-static is static"
            );
        }
        let dynamic = std::fs::read("/bin/ls").unwrap();
        assert!(!is_static_elf(&dynamic), "coreutils ls is dynamic");
        assert!(!is_static_elf(b"#!/bin/sh\n"));
    }
}
