//! What the operating system says about this process and its disk: resident memory, the
//! memory the process may use, a directory's free space, the CPU time of the calling thread. A leaf: imports nothing of the crate.
//!
//! Linux reads (`/proc`, cgroup v2/v1 files, `statvfs`); elsewhere each answers `None`, which
//! the callers treat as "unknown" (a budget that cannot be measured is not enforced).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

/// The process's resident memory, read from `/proc/self/statm` through a descriptor opened
/// once: one `pread` per read, no allocation.
#[derive(Debug)]
pub struct Rss {
    statm: File,
    page: u64,
}

impl Rss {
    /// `None` where `/proc/self/statm` cannot be opened (not Linux, no /proc).
    pub fn open() -> Option<Rss> {
        let statm = File::open("/proc/self/statm").ok()?;
        // SAFETY: sysconf takes no pointers.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        let page = u64::try_from(page).ok().filter(|p| *p > 0).unwrap_or(4096);
        Some(Rss { statm, page })
    }

    /// Resident bytes now.
    pub fn bytes(&self) -> io::Result<u64> {
        let mut buf = [0u8; 96];
        let n = self.statm.read_at(&mut buf, 0)?;
        // "size resident shared text lib data dt": the second field, in pages.
        let pages = buf[..n]
            .split(|b| *b == b' ')
            .nth(1)
            .and_then(parse_u64)
            .ok_or_else(|| io::Error::other("unexpected /proc/self/statm"))?;
        Ok(pages.saturating_mul(self.page))
    }
}

fn parse_u64(digits: &[u8]) -> Option<u64> {
    let digits = digits.strip_suffix(b"\n").unwrap_or(digits);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| {
        d.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .flatten()
    })
}

/// The memory this process may use, bytes: the machine's (`MemTotal`), or its cgroup's limit
/// when that is lower (a container). `None` when neither can be read.
pub fn usable_memory() -> Option<u64> {
    let total = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
        let kb = line.split_whitespace().nth(1)?.parse::<u64>().ok()?;
        Some(kb.saturating_mul(1024))
    });
    let cgroup = [
        "/sys/fs/cgroup/memory.max",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes",
    ]
    .iter()
    .filter_map(|p| std::fs::read_to_string(p).ok())
    .find_map(|s| s.trim().parse::<u64>().ok());
    match (total, cgroup) {
        (Some(t), Some(c)) => Some(t.min(c)),
        (t, c) => t.or(c),
    }
}

/// Bytes available to an unprivileged writer on the file system holding `dir`.
pub fn free_disk(dir: &Path) -> io::Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL in the path"))?;
    // SAFETY: statvfs writes into the zeroed struct we own; the path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // the field types differ between targets
    Ok((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// The CPU time the calling thread has used (`CLOCK_THREAD_CPUTIME_ID`); `None` where the
/// clock cannot be read.
pub fn thread_cpu() -> Option<std::time::Duration> {
    // SAFETY: clock_gettime writes into the zeroed struct we own.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    if unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) } != 0 {
        return None;
    }
    let secs = u64::try_from(ts.tv_sec).ok()?;
    let nanos = u32::try_from(ts.tv_nsec).ok()?;
    Some(std::time::Duration::new(secs, nanos))
}

/// Hands the heap's free pages back to the kernel (glibc's `malloc_trim(0)`), so that the
/// process's resident memory, which the capture budget reads, counts what is allocated
/// again as growth. Elsewhere (another libc) it does nothing.
pub fn return_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and only walks the allocator's own state, taking
    // each arena's lock itself: safe beside any thread's malloc and free.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_grows_with_touched_pages() {
        let rss = Rss::open().expect("/proc/self/statm");
        let before = rss.bytes().unwrap();
        assert!(before > 0);
        let block = std::hint::black_box(vec![1u8; 64 << 20]);
        let after = rss.bytes().unwrap();
        assert!(after >= before + (48 << 20), "{before} -> {after}");
        drop(block);
    }

    #[test]
    fn statm_fields_parse() {
        assert_eq!(parse_u64(b"123\n"), Some(123));
        assert_eq!(parse_u64(b""), None);
        assert_eq!(parse_u64(b"12a"), None);
        assert_eq!(parse_u64(b"99999999999999999999999"), None);
    }

    #[test]
    fn a_thread_s_cpu_time_grows_with_its_work_only() {
        let before = thread_cpu().expect("the thread's CPU clock");
        // Work on this thread: its clock moves, by however little.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
        }
        let worked = thread_cpu().expect("the thread's CPU clock");
        assert!(worked > before, "{before:?} -> {worked:?}");
        // Another thread's work is not this thread's: its clock starts near zero.
        let other = std::thread::spawn(thread_cpu)
            .join()
            .unwrap()
            .expect("its clock");
        assert!(other < worked, "{other:?} against {worked:?}");
    }

    #[test]
    fn machine_memory_and_free_disk_are_known_here() {
        assert!(usable_memory().is_some_and(|b| b > (64 << 20)));
        assert!(free_disk(Path::new("/")).is_ok());
        assert!(free_disk(Path::new("/no/such/dir")).is_err());
    }
}
