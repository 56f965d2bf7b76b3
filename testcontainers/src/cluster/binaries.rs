//! Where the machine's `initdb` and `postgres` are: found once per process.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The directory holding `initdb` and `postgres`, searched once per process.
pub(crate) fn find_bindir() -> Result<PathBuf, String> {
    static BINDIR: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BINDIR.get_or_init(search_bindir).clone()
}

fn search_bindir() -> Result<PathBuf, String> {
    let mut looked = Vec::new();
    if let Some(dir) = std::env::var_os("PGTENANT_TESTKIT_PG_BINDIR") {
        let dir = PathBuf::from(dir);
        if has_server(&dir) {
            return Ok(dir);
        }
        looked.push(format!(
            "PGTENANT_TESTKIT_PG_BINDIR={} has no initdb and postgres",
            dir.display()
        ));
    }
    match Command::new("pg_config")
        .arg("--bindir")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
    {
        Ok(out) if out.status.success() => {
            let dir = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
            if has_server(&dir) {
                return Ok(dir);
            }
            looked.push(format!(
                "`pg_config --bindir` is {}, which has no initdb and postgres (only the client is installed?)",
                dir.display()
            ));
        }
        _ => looked.push("no pg_config on PATH".to_owned()),
    }
    let mut on_path = false;
    for dir in std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
    {
        let initdb = dir.join("initdb");
        if !initdb.is_file() {
            continue;
        }
        on_path = true;
        // Debian links /usr/bin or /usr/local/bin entries to the real bindir;
        // postgres must come from the same installation as initdb.
        if let Some(real) = fs::canonicalize(&initdb)
            .ok()
            .and_then(|p| p.parent().map(Path::to_path_buf))
        {
            if has_server(&real) {
                return Ok(real);
            }
        }
        if has_server(&dir) {
            return Ok(dir);
        }
    }
    looked.push(if on_path {
        "initdb on PATH has no postgres beside it".to_owned()
    } else {
        "no initdb on PATH".to_owned()
    });
    let mut versioned: Vec<(Vec<u32>, PathBuf)> = Vec::new();
    // Debian/Ubuntu: /usr/lib/postgresql/<version>/bin.
    if let Ok(entries) = fs::read_dir("/usr/lib/postgresql") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            versioned.push((version_key(&name), entry.path().join("bin")));
        }
    }
    // RHEL/Fedora (PGDG): /usr/pgsql-<version>/bin.
    if let Ok(entries) = fs::read_dir("/usr") {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if let Some(version) = name.strip_prefix("pgsql-") {
                versioned.push((version_key(version), entry.path().join("bin")));
            }
        }
    }
    versioned.sort_by(|a, b| b.0.cmp(&a.0));
    if let Some((_, dir)) = versioned.into_iter().find(|(_, dir)| has_server(dir)) {
        return Ok(dir);
    }
    looked.push(
        "no /usr/lib/postgresql/*/bin or /usr/pgsql-*/bin with initdb and postgres".to_owned(),
    );
    Err(format!(
        "no PostgreSQL server binaries (initdb and postgres) on this machine: {}; install them \
         (e.g. `apt-get install postgresql`) or set PGTENANT_TESTKIT_PG_BINDIR",
        looked.join("; ")
    ))
}

fn version_key(version: &str) -> Vec<u32> {
    version
        .split('.')
        .map(|part| part.parse().unwrap_or(0))
        .collect()
}

fn has_server(dir: &Path) -> bool {
    let executable = |name: &str| {
        fs::metadata(dir.join(name))
            .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    executable("initdb") && executable("postgres")
}
