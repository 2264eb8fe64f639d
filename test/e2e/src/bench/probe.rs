//! What a benchmark reads about a running process (from /proc) and about the requests an API
//! server saw (from its audit log).

use std::collections::{BTreeMap, HashSet};
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use jiff::Timestamp;

use crate::controlplane::{AuditEvent, audited_requests};

/// A process, read through /proc.
#[derive(Clone, Copy, Debug)]
pub struct ProcessProbe {
    pub pid: u32,
}

/// Memory of a process, in KiB.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct Memory {
    /// Resident now.
    pub rss_kib: u64,
    /// The highest resident size so far.
    pub hwm_kib: u64,
}

impl ProcessProbe {
    pub fn memory(&self) -> Option<Memory> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).ok()?;
        let field = |key: &str| {
            status.lines().find_map(|line| {
                line.strip_prefix(key)?
                    .trim()
                    .strip_suffix("kB")?
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
        };
        Some(Memory {
            rss_kib: field("VmRSS:")?,
            hwm_kib: field("VmHWM:")?,
        })
    }

    /// User plus system CPU time so far, in seconds.
    pub fn cpu_seconds(&self) -> Option<f64> {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).ok()?;
        // Fields after the command name (which may hold spaces): state is field 3, utime 14,
        // stime 15.
        let rest = &stat[stat.rfind(')')? + 2..];
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
        // SAFETY: sysconf has no preconditions.
        let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
        (per_second > 0).then(|| ticks as f64 / per_second as f64)
    }

    /// Established TCP connections of this process to `port` on any address.
    pub fn connections_to(&self, port: u16) -> usize {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", self.pid)) else {
            return 0;
        };
        let inodes: HashSet<u64> = fds
            .flatten()
            .filter_map(|fd| {
                let target = std::fs::read_link(fd.path()).ok()?;
                let target = target.to_str()?;
                target
                    .strip_prefix("socket:[")?
                    .strip_suffix(']')?
                    .parse()
                    .ok()
            })
            .collect();
        let mut count = 0;
        for table in ["tcp", "tcp6"] {
            let Ok(text) = std::fs::read_to_string(format!("/proc/{}/net/{table}", self.pid))
            else {
                continue;
            };
            // sl local_address rem_address st … inode: addresses as HEX_IP:HEX_PORT, st 01 is
            // ESTABLISHED.
            for line in text.lines().skip(1) {
                let fields: Vec<&str> = line.split_whitespace().collect();
                let remote_port = fields
                    .get(2)
                    .and_then(|f| f.rsplit_once(':'))
                    .and_then(|(_, p)| u16::from_str_radix(p, 16).ok());
                let inode = fields.get(9).and_then(|f| f.parse::<u64>().ok());
                if remote_port == Some(port)
                    && fields.get(3) == Some(&"01")
                    && inode.is_some_and(|i| inodes.contains(&i))
                {
                    count += 1;
                }
            }
        }
        count
    }
}

/// The audit log of one API server, read as it grows.
pub struct AuditTail {
    path: PathBuf,
    offset: u64,
    partial: String,
    /// Every request seen so far (see [`audited_requests`]).
    pub events: Vec<AuditEvent>,
}

impl AuditTail {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            offset: 0,
            partial: String::new(),
            events: Vec::new(),
        }
    }

    /// Reads what was appended since the last call.
    pub fn refresh(&mut self) {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return;
        };
        if file.metadata().is_ok_and(|m| m.len() < self.offset) {
            // Rotated under us: the new file from its start (what the old one got after the
            // last read is lost; the API servers here do not rotate).
            eprintln!(
                "bench: {} was rotated; reading the new file",
                self.path.display()
            );
            self.offset = 0;
            self.partial.clear();
        }
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return;
        }
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() {
            return;
        }
        self.offset += bytes.len() as u64;
        // Lossy: one line with bytes that are not UTF-8 must not stop the tail for good.
        let mut text = std::mem::take(&mut self.partial);
        text.push_str(&String::from_utf8_lossy(&bytes));
        // A line still being written stays for the next call.
        let complete = text.rfind('\n').map_or(0, |i| i + 1);
        self.partial = text[complete..].to_owned();
        self.events.extend(audited_requests(&text[..complete]));
    }

    /// Requests by `user` received in `[from, to)`.
    pub fn requests(&self, user: &str, from: Timestamp, to: Timestamp) -> Requests {
        self.requests_where(|e| e.user.username == user, from, to)
    }

    /// Requests received in `[from, to)` for which `which` holds.
    pub fn requests_where(
        &self,
        which: impl Fn(&AuditEvent) -> bool,
        from: Timestamp,
        to: Timestamp,
    ) -> Requests {
        let mut requests = Requests::default();
        for event in self.events.iter().filter(|e| which(e)) {
            let Some(at) = event.received() else { continue };
            if at < from || at >= to {
                continue;
            }
            let resource = event
                .object_ref
                .as_ref()
                .map(|o| match o.subresource.as_str() {
                    "" => o.resource.clone(),
                    sub => format!("{}/{sub}", o.resource),
                })
                // A non-resource request (discovery, /version): its path.
                .unwrap_or_else(|| event.request_uri.clone());
            if resource == "leases" {
                requests.leases += 1;
                continue;
            }
            *requests
                .by_kind
                .entry(format!("{} {resource}", event.verb))
                .or_default() += 1;
            requests.other += 1;
            requests.writes += usize::from(event.is_write());
        }
        requests
    }
}

/// Requests counted in a window.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Requests {
    /// Lease requests (leader election).
    pub leases: usize,
    /// Everything else.
    pub other: usize,
    /// Writes among `other`.
    pub writes: usize,
    /// `<verb> <resource>` → count, Leases excluded.
    pub by_kind: BTreeMap<String, usize>,
}

impl Requests {
    /// The largest kinds, for the report: `"1000 get clusters, 5 list machines"`.
    pub fn top(&self, n: usize) -> String {
        let mut kinds: Vec<(&String, &usize)> = self.by_kind.iter().collect();
        kinds.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
        kinds
            .iter()
            .take(n)
            .map(|(kind, count)| format!("{count} {kind}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}
