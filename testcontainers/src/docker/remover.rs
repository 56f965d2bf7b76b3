//! The remover: a shell process that removes every container of this test process (by its
//! owner label) once the process is gone, however it ended, SIGKILL included.

use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::docker::api::Engine;

/// This label's value is unique to the test process; the remover removes by it.
pub(crate) const OWNER_LABEL: &str = "pgtenant.testkit.owner";

/// Unique to this process (pids are reused; the start time makes the token unique).
pub(crate) fn owner_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{}-{nanos}", std::process::id())
    })
}

/// Removes every container labelled with our token once its stdin closes, which happens
/// when this process exits in any way, SIGKILL included. `$1` is the token; `DOCKER_HOST` is
/// the engine the containers were started on. Its own process group: a Ctrl-C of the test
/// run does not stop it.
const REMOVER_SCRIPT: &str = r#"
trap '' HUP INT QUIT TERM PIPE
cat >/dev/null 2>&1
ids=$(docker ps -aq --filter "label=pgtenant.testkit.owner=$1" 2>/dev/null)
[ -n "$ids" ] && docker rm -f -v $ids >/dev/null 2>&1
exit 0
"#;

struct Remover {
    _child: Child,
    _stdin: ChildStdin,
}

/// Spawns this process's remover, once.
pub(crate) fn ensure_remover(engine: &Engine) {
    static REMOVER: OnceLock<Option<Remover>> = OnceLock::new();
    REMOVER.get_or_init(|| {
        let spawned = Command::new("/bin/sh")
            .arg("-c")
            .arg(REMOVER_SCRIPT)
            .arg("pgtenant-testkit-container-remover")
            .arg(owner_token())
            .env("DOCKER_HOST", &engine.url)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn();
        let has_cli = Command::new("docker")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !has_cli {
            tracing::warn!("no docker command: if this test process is killed, its containers stay (remove them with the label {OWNER_LABEL}={})", owner_token());
        }
        match spawned {
            Ok(mut child) => child.stdin.take().map(|stdin| Remover {
                _child: child,
                _stdin: stdin,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "no remover process (/bin/sh): if this test process is killed, its containers stay");
                None
            }
        }
    });
}
