//! Who owns a sandbox container, written in its owner label, and whether that owner can be
//! proven dead: the reaper removes a container only then.
//!
//! A process id means something only in one PID namespace of one boot of one kernel, and
//! Docker engines are shared across all three (CI jobs in containers, hosts on one remote
//! engine). So the label names the host (its machine id), the kernel's boot (its boot id, a
//! random UUID per boot), the PID namespace (the inode of `/proc/self/ns/pid`), and the
//! process (its pid and start time, which tell it from a later process with the same pid):
//! `machine=<id>;boot=<uuid>;pidns=<inode>;pid=<pid>;start=<ticks>`.
//!
//! The owner is dead when those name our own host, boot and PID namespace and the process
//! is gone, a zombie, or another process with the same pid. Anything else (another host,
//! boot or namespace, a label missing, empty or unreadable, as those of older versions) is
//! unknown, and unknown is never dead. The boot id and the namespace are what make the proof
//! sound: a namespace's inode may be reused once it is gone, but then so are all its
//! processes, and a new process with the same pid and the same start tick is not possible.
//! The machine id names the host for a person reading the label; where it cannot be read it
//! is written as `unknown`.

use std::fmt;
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

    /// Reads a label written by [`Owner::to_string`].
    pub(crate) fn parse(label: &str) -> Result<Self, String> {
        let mut fields = [None::<&str>; 5];
        const NAMES: [&str; 5] = ["machine", "boot", "pidns", "pid", "start"];
        for part in label.split(';') {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| format!("`{part}` is not name=value"))?;
            let index = NAMES
                .iter()
                .position(|n| *n == name)
                .ok_or_else(|| format!("unknown field `{name}`"))?;
            if fields[index].replace(value).is_some() {
                return Err(format!("`{name}` appears twice"));
            }
        }
        let field = |index: usize| -> Result<&str, String> {
            fields[index]
                .filter(|value| is_field(value))
                .ok_or_else(|| format!("no valid `{}`", NAMES[index]))
        };
        let number = |index: usize| -> Result<u64, String> {
            field(index)?
                .parse()
                .map_err(|_| format!("`{}` is not a number", NAMES[index]))
        };
        Ok(Self {
            place: Place {
                machine: field(0)?.to_owned(),
                boot: field(1)?.to_owned(),
                pid_ns: field(2)?.to_owned(),
            },
            pid: u32::try_from(number(3)?).map_err(|_| "`pid` is out of range".to_owned())?,
            start: number(4)?,
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
                "its owner ran in another boot ({}) of this host",
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

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "machine={};boot={};pidns={};pid={};start={}",
            self.place.machine, self.place.boot, self.place.pid_ns, self.pid, self.start
        )
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

/// What an owner label (absent, empty or unreadable ones included) says of its owner.
pub(crate) fn label_liveness(label: Option<&str>) -> Liveness {
    match label.map(str::trim) {
        None | Some("") => Liveness::Unknown("it has no owner label".to_owned()),
        Some(label) => match Owner::parse(label) {
            Ok(owner) => owner.liveness(),
            Err(problem) => Liveness::Unknown(format!("its owner label cannot be read: {problem}")),
        },
    }
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
    fn this_process_is_alive_and_its_label_reads_back() {
        let me = Owner::current().unwrap();
        let label = me.to_string();
        assert_eq!(Owner::parse(&label), Ok(me.clone()));
        assert_eq!(me.liveness(), Liveness::Alive);
        assert_eq!(label_liveness(Some(&label)), Liveness::Alive);
        assert!(label.starts_with("machine="), "{label}");
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
        for label in [
            None,
            Some(""),
            Some("  "),
            // The format of older versions: `<boot id>:<pid>:<start>`.
            Some("4f0c-boot:12:345"),
            Some("machine=;boot=b;pidns=1;pid=2;start=3"),
            Some("machine=m;boot=b;pidns=1;pid=x;start=3"),
            Some("machine=m;boot=b;pidns=1;pid=2"),
            Some("machine=m;boot=b;pidns=1;pid=2;start=3;pid=4"),
        ] {
            assert!(
                matches!(label_liveness(label), Liveness::Unknown(_)),
                "{label:?}"
            );
        }
    }
}
