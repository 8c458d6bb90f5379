//! Files that are only ever whole under their final names: temporaries that name their process
//! (`.{name}.{pid}.partial…`), written, fsynced and renamed into place; and whether the process
//! a temporary names is still alive. A leaf: it imports nothing of the crate but the error.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Removes the file on drop unless disarmed: temporaries never outlive a failed write.
pub struct TempFile(Option<PathBuf>);

impl TempFile {
    /// A temporary at `path`, removed on drop unless [`TempFile::keep`] is called.
    pub fn new(path: PathBuf) -> Self {
        TempFile(Some(path))
    }
    /// Where it is (empty once kept).
    pub fn path(&self) -> &Path {
        self.0.as_deref().unwrap_or(Path::new(""))
    }
    /// Leaves the file where it is: it was renamed, or is meant to stay.
    pub fn keep(mut self) {
        self.0 = None;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// The marker every temporary name carries: `.{name}.{pid}.partial…`, so the next start in
/// the directory can tell a dead process's leftovers from a live one's writes.
const PARTIAL: &str = "partial";

/// `.{name}.{pid}.partial{suffix}` in `dir`.
pub fn temp_path(dir: &Path, name: &str, suffix: &str) -> PathBuf {
    dir.join(format!(".{name}.{}.{PARTIAL}{suffix}", std::process::id()))
}

/// The endings of the files stepscope writes through temporaries (traces, manifests, op
/// tables): a temporary another tool renamed (no longer hidden) still ends so before its pid.
const WRITTEN_ENDINGS: [&str; 4] = [
    ".trace.json.gz",
    ".trace.json",
    ".stepscope.json",
    ".profiler_out.txt",
];

/// The pid in a temporary's name, `.{name}.{pid}.partial…`; also in one that a tool moving a
/// directory's files renamed with a prefix (`{prefix}.{name}.{pid}.partial…`, verl's
/// relocation), when `{name}` is a file stepscope writes.
pub fn temp_owner(name: &str) -> Option<u32> {
    let at = name.rfind(&format!(".{PARTIAL}"))?;
    let before = &name[..at];
    let dot = before.rfind('.')?;
    let written = &before[..dot];
    let ours = name.starts_with('.') || WRITTEN_ENDINGS.iter().any(|e| written.ends_with(e));
    if !ours || written.is_empty() || written == "." {
        return None;
    }
    before[dot + 1..].parse().ok()
}

/// Whether `path` is a regular file (not a FIFO, not a link).
pub fn is_regular_file(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_file())
}

/// `path` with `suffix` appended to its last component.
pub fn suffixed(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(suffix);
    PathBuf::from(s)
}

/// Whether process `pid` exists (one of another user's counts).
pub fn process_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill with signal 0 sends nothing; it only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Writes `bytes` to `path` so that `path` only ever holds a whole file: into a temporary
/// beside it (named after this process), fsynced, then renamed over `path`. The temporary is
/// removed when any step fails.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_synced(path, bytes)?.rename()
}

/// [`write_atomic`] but the rename: `bytes` whole and fsynced in `path`'s temporary, for a file
/// made beside another that must be in place first.
pub fn write_synced(path: &Path, bytes: &[u8]) -> Result<Synced> {
    let mut file = AtomicFile::create(path)?;
    file.write_all(bytes)
        .map_err(|e| Error::io(file.tmp.path(), format!("cannot write: {e}"), e))?;
    file.sync()
}

/// A file written as it streams that `path` only ever holds whole: the bytes go into a
/// temporary beside it (named after this process, removed if the file is dropped before
/// [`AtomicFile::commit`]), which the commit fsyncs and renames over `path`.
pub struct AtomicFile {
    path: PathBuf,
    tmp: TempFile,
    out: io::BufWriter<File>,
}

impl AtomicFile {
    /// Begins `path`'s temporary.
    pub fn create(path: &Path) -> Result<Self> {
        let dir = path.parent().unwrap_or(Path::new("."));
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let tmp = TempFile::new(temp_path(dir, &name, ""));
        let file = File::create(tmp.path())
            .map_err(|e| Error::io(tmp.path(), format!("cannot write: {e}"), e))?;
        Ok(AtomicFile {
            path: path.to_path_buf(),
            tmp,
            out: io::BufWriter::new(file),
        })
    }

    /// What was written, fsynced and renamed over the final path: there, whole, on return.
    pub fn commit(self) -> Result<()> {
        self.sync()?.rename()
    }

    /// What was written, fsynced in its temporary but not yet in place: for a file made
    /// beside another that must be in place first ([`Synced::rename`] once it is).
    pub fn sync(self) -> Result<Synced> {
        let AtomicFile { path, tmp, out } = self;
        out.into_inner()
            .map_err(io::IntoInnerError::into_error)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::io(tmp.path(), format!("cannot write: {e}"), e))?;
        Ok(Synced { path, tmp })
    }
}

/// A file whole and fsynced in its temporary ([`AtomicFile::sync`]), removed if dropped before
/// [`Synced::rename`] puts it in place.
pub struct Synced {
    path: PathBuf,
    tmp: TempFile,
}

impl Synced {
    /// Renames it over its final path: there, whole, on return.
    pub fn rename(self) -> Result<()> {
        let Synced { path, tmp } = self;
        fs::rename(tmp.path(), &path).map_err(|e| {
            Error::io(
                &path,
                format!("cannot rename the written file into place: {e}"),
                e,
            )
        })?;
        tmp.keep();
        Ok(())
    }

    /// The name it has once in place.
    pub fn file_name(&self) -> String {
        self.path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temporaries_name_their_process() {
        let p = temp_path(Path::new("/d"), "w.1.pt.trace.json.gz", ".json");
        let name = p.file_name().unwrap().to_str().unwrap();
        assert_eq!(temp_owner(name), Some(std::process::id()));
        assert_eq!(temp_owner("w.1.pt.trace.json.gz"), None);
        assert_eq!(temp_owner(".w.1.stepscope.json.x.partial"), None);
        // Renamed by a tool that moved the directory's files with a prefix (verl).
        assert_eq!(
            temp_owner("rollout-replica0_.rank0.5.stepscope.json.77.partial"),
            Some(77)
        );
        assert_eq!(
            temp_owner("r_.rank0.5.pt.trace.json.gz.78.partial.json.tmp"),
            Some(78)
        );
        // A user's file that merely looks alike is not ours.
        assert_eq!(temp_owner("notes.12.partial"), None);
        assert_eq!(temp_owner("data.csv.12.partial"), None);
    }

    #[test]
    fn an_atomic_write_leaves_the_whole_file_and_no_temporary() {
        let dir = std::env::temp_dir().join(format!("stepscope-files-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.txt");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        // Into a directory that is not there: an error naming the temporary, nothing left.
        let e = write_atomic(&dir.join("missing/b.txt"), b"x").unwrap_err();
        assert!(e.to_string().contains("missing"), "{e}");
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_synced_file_is_only_in_place_once_renamed() {
        let dir = std::env::temp_dir().join(format!("stepscope-synced-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("t.profiler_out.txt");
        let mut file = AtomicFile::create(&path).unwrap();
        file.write_all(b"table").unwrap();
        let synced = file.sync().unwrap();
        assert_eq!(synced.file_name(), "t.profiler_out.txt");
        assert!(!path.exists(), "in place before the rename");
        synced.rename().unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"table");
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        // Dropped before its rename (the trace beside it failed): nothing is left.
        let mut file = AtomicFile::create(&dir.join("u.txt")).unwrap();
        file.write_all(b"x").unwrap();
        drop(file.sync().unwrap());
        assert_eq!(fs::read_dir(&dir).unwrap().count(), 1);
        fs::remove_dir_all(&dir).unwrap();
    }
}
