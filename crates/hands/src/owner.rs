//! Who owns a sandbox container, written in its owner label, and whether that owner can be
//! proven dead: the reaper removes a container only then.
//!
//! A process id means something only in one PID namespace of one boot of one kernel, and
//! Docker engines are shared across all three (CI jobs in containers, hosts on one remote
//! engine). So two labels say who owns a container:
//!
//! - `org.nerve.owner`: `<boot id>:<pid>:<start time>`, the kernel's boot (a random UUID per
//!   boot), the process, and its start time in clock ticks, which tells it from a later
//!   process with the same pid. The format older versions wrote, kept so that their reapers,
//!   which may share the engine, still see our live owners as alive.
//! - `org.nerve.owner.host`: `machine=<id>;pidns=<inode>`, the host (its machine id, or
//!   `unknown` where none can be read) and the PID namespace (the inode of
//!   `/proc/self/ns/pid`).
//!
//! The owner is dead when both labels name our own host, boot and PID namespace and the
//! process is gone, a zombie, or another process with the same pid. Anything else (another
//! host, boot or namespace, a label missing, empty or unreadable, as older versions' lack
//! the host label) is unknown, and unknown is never dead. The boot id and the namespace are
//! what make the proof sound: a namespace's inode may be reused once it is gone, but then so
//! are all its processes, and a new process with the same pid and the same start tick is not
//! possible. The machine id names the host for a person reading the label.

use std::sync::LazyLock;

/// Where this process runs: host, boot and PID namespace, read once.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Place {
    machine: String,
    boot: String,
    pid_ns: String,
}

static HERE: LazyLock<Option<Place>> = LazyLock::new(|| {
    let machine = ["/etc/machine-id", "/var/lib/dbus/machine-id"]
        .iter()
        .find_map(|path| {
            let id = std::fs::read_to_string(path).ok()?;
            let id = id.trim();
            is_field(id).then(|| id.to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned());
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let boot = boot.trim().to_owned();
    // `pid:[4026531836]`: the namespace's inode.
    let pid_ns = std::fs::read_link("/proc/self/ns/pid").ok()?;
    let pid_ns = pid_ns
        .to_str()?
        .strip_prefix("pid:[")?
        .strip_suffix(']')?
        .to_owned();
    (is_field(&boot) && is_field(&pid_ns)).then_some(Place {
        machine,
        boot,
        pid_ns,
    })
});

/// A label field: non-empty, and nothing that would confuse the format.
fn is_field(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The process that owns a container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Owner {
    place: Place,
    pub(crate) pid: u32,
    /// The process's start time, in clock ticks after boot (field 22 of `/proc/<pid>/stat`).
    start: u64,
}

impl Owner {
    /// This process; `None` where `/proc` does not say enough (then the container gets an
    /// empty label, which no reaper will act on).
    pub(crate) fn current() -> Option<Self> {
        let pid = std::process::id();
        let place = HERE.clone()?;
        let ProcState { start, .. } = proc_state(pid).ok()??;
        Some(Self { place, pid, start })
    }

    /// The value of `org.nerve.owner`: `<boot>:<pid>:<start>`.
    pub(crate) fn process_label(&self) -> String {
        format!("{}:{}:{}", self.place.boot, self.pid, self.start)
    }

    /// The value of `org.nerve.owner.host`: `machine=<id>;pidns=<inode>`.
    pub(crate) fn host_label(&self) -> String {
        format!("machine={};pidns={}", self.place.machine, self.place.pid_ns)
    }

    /// Reads the two labels written from [`Owner::process_label`] and [`Owner::host_label`].
    pub(crate) fn parse(process: &str, host: &str) -> Result<Self, String> {
        let mut parts = process.split(':');
        let (Some(boot), Some(pid), Some(start), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("`{process}` is not <boot>:<pid>:<start>"));
        };
        let mut machine = None;
        let mut pid_ns = None;
        for part in host.split(';') {
            let (slot, value) = match part.split_once('=') {
                Some(("machine", value)) => (&mut machine, value),
                Some(("pidns", value)) => (&mut pid_ns, value),
                Some(_) | None => return Err(format!("`{part}` is not machine= or pidns=")),
            };
            if slot.replace(value).is_some() {
                return Err(format!("`{part}` appears twice"));
            }
        }
        let field = |value: Option<&str>, name: &str| -> Result<String, String> {
            value
                .filter(|value| is_field(value))
                .map(str::to_owned)
                .ok_or_else(|| format!("no valid {name}"))
        };
        Ok(Self {
            place: Place {
                machine: field(machine, "machine id")?,
                boot: field(Some(boot), "boot id")?,
                pid_ns: field(pid_ns, "PID namespace")?,
            },
            pid: pid.parse().map_err(|_| format!("`{pid}` is not a pid"))?,
            start: start
                .parse()
                .map_err(|_| format!("`{start}` is not a start time"))?,
        })
    }

    /// Whether this owner is provably dead, alive, or beyond what this process can see.
    pub(crate) fn liveness(&self) -> Liveness {
        let Some(here) = HERE.as_ref() else {
            return Liveness::Unknown("this process cannot tell where it runs".to_owned());
        };
        if self.place.machine != here.machine {
            return Liveness::Unknown(format!("its owner runs on host {}", self.place.machine));
        }
        if self.place.boot != here.boot {
            return Liveness::Unknown(format!(
                "its owner ran under another boot id ({})",
                self.place.boot
            ));
        }
        if self.place.pid_ns != here.pid_ns {
            return Liveness::Unknown(format!(
                "its owner runs in another PID namespace ({})",
                self.place.pid_ns
            ));
        }
        match proc_state(self.pid) {
            Ok(None) => Liveness::Dead,
            Ok(Some(state)) if state.start != self.start || state.zombie => Liveness::Dead,
            Ok(Some(_)) => Liveness::Alive,
            Err(reason) => Liveness::Unknown(reason),
        }
    }
}

/// What can be said of a container's owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Liveness {
    /// Its process runs (it may be between tool calls, its container stopped).
    Alive,
    /// Its process is gone: the container is an orphan.
    Dead,
    /// Nothing can be proven, for this reason; the container is left alone.
    Unknown(String),
}

/// What the two owner labels (absent, empty or unreadable ones included) say of the owner.
pub(crate) fn label_liveness(process: Option<&str>, host: Option<&str>) -> Liveness {
    match (present(process), present(host)) {
        (None, _) => Liveness::Unknown("it has no owner label".to_owned()),
        (Some(_), None) => Liveness::Unknown(
            "it has no owner host label (an older version's, or not Nerve's)".to_owned(),
        ),
        (Some(process), Some(host)) => match Owner::parse(process, host) {
            Ok(owner) => owner.liveness(),
            Err(problem) => {
                Liveness::Unknown(format!("its owner labels cannot be read: {problem}"))
            }
        },
    }
}

/// A label with something in it.
fn present(label: Option<&str>) -> Option<&str> {
    label.map(str::trim).filter(|label| !label.is_empty())
}

struct ProcState {
    start: u64,
    zombie: bool,
}

/// The start time and state of process `pid` in our PID namespace; `Ok(None)` when there
/// is no such process. Existence is asked of the kernel (`kill(pid, 0)`), which answers
/// also where `/proc` hides other users' processes (`hidepid`).
fn proc_state(pid: u32) -> Result<Option<ProcState>, String> {
    let Some(process) = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
    else {
        return Ok(None);
    };
    // Anything but ESRCH (EPERM: another user's) means it exists.
    if let Err(rustix::io::Errno::SRCH) = rustix::process::test_kill_process(process) {
        return Ok(None);
    }
    let stat = match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat,
        // It ended between the two looks.
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return match rustix::process::test_kill_process(process) {
                Err(rustix::io::Errno::SRCH) => Ok(None),
                Ok(()) | Err(_) => Err(format!("process {pid} exists but /proc hides it")),
            };
        }
        Err(error) => return Err(format!("cannot read /proc/{pid}/stat: {error}")),
    };
    // Fields 3 (state) and 22 (start time); the command name (field 2) may hold spaces and
    // parentheses, so count after its last `)`.
    let mut fields = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace())
        .ok_or_else(|| format!("/proc/{pid}/stat cannot be read"))?;
    let state = fields.next().unwrap_or_default();
    let start = fields
        .nth(18)
        .and_then(|start| start.parse().ok())
        .ok_or_else(|| format!("/proc/{pid}/stat has no start time"))?;
    Ok(Some(ProcState {
        start,
        zombie: matches!(state, "Z" | "X" | "x"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_alive_and_its_labels_read_back() {
        let me = Owner::current().unwrap();
        let (process, host) = (me.process_label(), me.host_label());
        assert_eq!(Owner::parse(&process, &host), Ok(me.clone()));
        assert_eq!(me.liveness(), Liveness::Alive);
        assert_eq!(label_liveness(Some(&process), Some(&host)), Liveness::Alive);
        assert!(host.starts_with("machine="), "{host}");
        assert_eq!(process.split(':').count(), 3, "{process}");
    }

    #[test]
    fn a_process_that_ended_or_is_a_zombie_is_dead() {
        // A child that exited but was not waited for is a zombie: its pid and start time
        // still answer, yet it is dead.
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        let place = HERE.clone().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let alive_start = loop {
            match proc_state(pid).unwrap() {
                Some(state) if state.zombie => break state.start,
                Some(_) if std::time::Instant::now() < deadline => std::thread::yield_now(),
                Some(_) => panic!("`true` did not exit within a minute"),
                None => panic!("the child was reaped by someone else"),
            }
        };
        let owner = Owner {
            place,
            pid,
            start: alive_start,
        };
        assert_eq!(owner.liveness(), Liveness::Dead, "a zombie");
        child.wait().unwrap();
        assert_eq!(owner.liveness(), Liveness::Dead, "a reaped process");
        let reused = Owner {
            start: Owner::current().unwrap().start + 1,
            ..Owner::current().unwrap()
        };
        assert_eq!(reused.liveness(), Liveness::Dead, "pid reuse");
    }

    #[test]
    fn elsewhere_is_unknown_never_dead() {
        let me = Owner::current().unwrap();
        let moved = |change: fn(&mut Place)| {
            let mut owner = Owner {
                pid: 999_999_999,
                ..me.clone()
            };
            change(&mut owner.place);
            owner.liveness()
        };
        assert_eq!(moved(|_| {}), Liveness::Dead, "here, and gone");
        for change in [
            (|p: &mut Place| p.machine = "0ther".into()) as fn(&mut Place),
            |p| p.boot = "another-boot".into(),
            |p| p.pid_ns = "1".into(),
        ] {
            assert!(matches!(moved(change), Liveness::Unknown(_)));
        }
        let (process, host) = (me.process_label(), me.host_label());
        let dead = format!("{}:999999999:1", me.place.boot);
        assert_eq!(label_liveness(Some(&dead), Some(&host)), Liveness::Dead);
        for (process, host) in [
            (None, Some(host.as_str())),
            (Some(""), Some(host.as_str())),
            (Some("  "), Some(host.as_str())),
            // Older versions wrote no host label.
            (Some(dead.as_str()), None),
            (Some(dead.as_str()), Some("")),
            (Some(process.as_str()), Some("machine=;pidns=1")),
            (Some(process.as_str()), Some("machine=m")),
            (Some(process.as_str()), Some("machine=m;pidns=1;pidns=2")),
            (Some(process.as_str()), Some("machine=m;pid=1")),
            (Some("boot:x:3"), Some(host.as_str())),
            (Some("boot:1"), Some(host.as_str())),
            (Some("boot:1:2:3"), Some(host.as_str())),
        ] {
            assert!(
                matches!(label_liveness(process, host), Liveness::Unknown(_)),
                "{process:?} {host:?}"
            );
        }
    }
}
