//! Where a capture's traces go and what names them: the trace directory, created and checked
//! writable; a trace id as torch makes one; the Unix time in nanoseconds.

use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::config::{is_uri_path, ProfilerConfig};
use crate::error::{Error, Result};
use crate::files::{temp_path, TempFile};

/// A trace id as torch's profiler makes one: 128 random bits, 32 upper-case hex digits.
pub(super) fn trace_id() -> String {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS's randomness once per process, then stepped; mixing in
    // the time and pid keeps ids distinct across processes and sessions.
    let mut words = [0u64; 2];
    for (i, w) in words.iter_mut().enumerate() {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(unix_ns());
        h.write_u32(std::process::id());
        h.write_usize(i);
        *w = h.finish();
    }
    format!("{:016X}{:016X}", words[0], words[1])
}

pub(super) fn unix_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos())
}

/// The config's trace directory, created if missing, checked writable.
pub(super) fn trace_dir(config: &ProfilerConfig) -> Result<PathBuf> {
    let dir = &config.torch_profiler_dir;
    if is_uri_path(dir) {
        return Err(Error::config(
            "torch_profiler_dir",
            format!(
                "{dir:?} is a URI; stepscope writes traces to a local directory only (write \
                 locally and upload the finished files)"
            ),
        ));
    }
    let dir = PathBuf::from(dir);
    ensure_writable_dir(&dir)?;
    Ok(dir)
}

pub(super) fn ensure_writable_dir(dir: &Path) -> Result<()> {
    let io = |what: &str, e: std::io::Error| Error::io(dir, format!("{what}: {e}"), e);
    std::fs::create_dir_all(dir).map_err(|e| io("cannot create the torch_profiler_dir", e))?;
    let probe = TempFile::new(probe_path(dir));
    std::fs::File::create(probe.path())
        .map_err(|e| io("the torch_profiler_dir is not writable", e))?;
    Ok(())
}

/// The file a start creates and removes to check that `dir` is writable. Named as every
/// temporary is (`.{name}.{pid}.partial…`), so a process killed between the create and the
/// remove leaves a file that the next start's clean-up knows to remove.
fn probe_path(dir: &Path) -> PathBuf {
    temp_path(dir, "stepscope-probe", "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::temp_owner;

    #[test]
    fn a_dead_processs_probe_is_a_temporary_the_clean_up_removes() {
        let probe = probe_path(Path::new("/traces"));
        let name = probe
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        assert_eq!(temp_owner(name), Some(std::process::id()), "{name}");
    }

    #[test]
    fn the_probe_is_gone_once_the_directory_is_found_writable() {
        let dir = std::env::temp_dir().join(format!("stepscope-probe-test-{}", std::process::id()));
        ensure_writable_dir(&dir).unwrap();
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(left.is_empty(), "{left:?}");
    }
}
