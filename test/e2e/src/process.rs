//! Child processes of the environment (etcd, kube-apiservers, the node simulator).
//!
//! Nothing may outlive the environment, even when a test panics or the run is interrupted:
//! - each child leads its own process group, and `Drop` SIGKILLs the whole group (a
//!   kube-apiserver ignores SIGTERM for more than 10 s, and tests should not wait for it);
//! - each child gets `PR_SET_PDEATHSIG = SIGKILL`, so the kernel kills it when the thread that
//!   spawned it dies — including when the test process is killed. The harness therefore spawns
//!   children only from a thread that lives as long as the environment (see `crate::shared`).

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard};

use crate::Error;

pub struct Process {
    pub name: String,
    pub log: PathBuf,
    child: Child,
}

impl Process {
    /// Starts `command` with stdout and stderr written to a fresh `<log_dir>/<name>.log`.
    pub fn spawn(name: &str, command: Command, log_dir: &Path) -> Result<Self, Error> {
        Self::spawn_logging(name, command, log_dir, false)
    }

    /// Starts `command` again under the same name: its output is appended to the log of the
    /// previous run (a restarted kube-apiserver keeps one log).
    pub fn respawn(name: &str, command: Command, log_dir: &Path) -> Result<Self, Error> {
        Self::spawn_logging(name, command, log_dir, true)
    }

    fn spawn_logging(
        name: &str,
        mut command: Command,
        log_dir: &Path,
        append: bool,
    ) -> Result<Self, Error> {
        let log = log_dir.join(format!("{name}.log"));
        let out = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .append(append)
            .truncate(!append)
            .open(&log)
            .map_err(|e| Error::io(&log, e))?;
        let err = out.try_clone().map_err(|e| Error::io(&log, e))?;
        command.stdout(out).stderr(err);
        Self::start(name, command, log)
    }

    /// Starts `command` with the terminal's stdout and stderr (for `make run`).
    pub fn spawn_foreground(name: &str, command: Command) -> Result<Self, Error> {
        Self::start(name, command, PathBuf::from("/dev/stdout"))
    }

    /// Starts `command` supervised (see the module), without stdin; `log` is where its output
    /// goes.
    fn start(name: &str, mut command: Command, log: PathBuf) -> Result<Self, Error> {
        supervise(&mut command);
        let child = command
            .stdin(Stdio::null())
            .spawn()
            .map_err(|e| Error::Spawn {
                name: name.to_owned(),
                source: e,
            })?;
        Ok(Self {
            name: name.to_owned(),
            log,
            child,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether the process is still running; a dead one is an environment failure worth a
    /// clear message (its log tells why).
    pub fn check_running(&mut self) -> Result<(), Error> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Error::Exited {
                name: self.name.clone(),
                status: status.to_string(),
                log: self.log.clone(),
            }),
            Err(e) => Err(Error::io(&self.log, e)),
        }
    }

    /// Resident set size in KiB (from /proc), for measurements.
    pub fn rss_kib(&self) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        status.lines().find_map(|line| {
            line.strip_prefix("VmRSS:")?
                .trim()
                .strip_suffix("kB")?
                .trim()
                .parse()
                .ok()
        })
    }

    /// The last lines of the log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Prints the last 60 log lines when the current thread panics (a failing test shows what
    /// the process said).
    pub fn report_if_panicking(&self) {
        if std::thread::panicking() {
            eprintln!(
                "--- {} log (last 60 lines) ---\n{}",
                self.name,
                self.log_tail(60)
            );
        }
    }

    /// Sends SIGTERM and waits up to `timeout` for the exit; `None` if it did not exit.
    pub fn terminate(&mut self, timeout: std::time::Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: plain syscall on our own child.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = std::time::Instant::now() + timeout;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        None
    }

    pub fn kill(&mut self) {
        let pgid = self.child.id() as libc::pid_t;
        // SAFETY: plain syscall; a negative pid addresses the child's process group.
        unsafe {
            libc::kill(-pgid, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The environment's children, killed together by [`Processes::stop`] (or when dropped). A
/// child can be taken out and replaced (a restarted kube-apiserver); once stopped, nothing can
/// be added any more.
#[derive(Default)]
pub struct Processes {
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    list: Vec<Process>,
    stopped: bool,
}

impl Processes {
    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Adds a child; after [`Processes::stop`] it is killed instead (returns false).
    pub fn push(&self, process: Process) -> bool {
        let mut table = self.table();
        if table.stopped {
            drop(table);
            drop(process);
            return false;
        }
        table.list.push(process);
        true
    }

    /// Takes the child named `name` out (it is killed when the caller drops it).
    pub fn take(&self, name: &str) -> Option<Process> {
        let mut table = self.table();
        let index = table.list.iter().position(|p| p.name == name)?;
        Some(table.list.remove(index))
    }

    pub fn is_stopped(&self) -> bool {
        self.table().stopped
    }

    /// Process id of the child named `name`, if it runs.
    pub fn pid(&self, name: &str) -> Option<u32> {
        self.table()
            .list
            .iter()
            .find(|p| p.name == name)
            .map(Process::pid)
    }

    /// Current RSS of every child, in KiB.
    pub fn rss_kib(&self) -> BTreeMap<String, u64> {
        self.table()
            .list
            .iter()
            .filter_map(|p| Some((p.name.clone(), p.rss_kib()?)))
            .collect()
    }

    /// Kills every child; nothing can be added afterwards.
    pub fn stop(&self) {
        let list = {
            let mut table = self.table();
            table.stopped = true;
            std::mem::take(&mut table.list)
        };
        drop(list);
    }
}

/// Makes the child lead its own process group and die with the spawning thread.
fn supervise(command: &mut Command) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe libc calls between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::setpgid(0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}
