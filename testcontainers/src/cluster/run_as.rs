//! Who initdb and postgres run as: as root, an unprivileged account (both refuse root).

use std::ffi::CString;

use crate::error::TestkitError;

/// The unprivileged account initdb and postgres run as when we are root
/// (both refuse to run as root).
#[derive(Debug, Clone)]
pub(crate) struct RunAs {
    pub(crate) name: String,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
}

/// `None` unless we are root; then the `postgres` or else `nobody` account.
pub(crate) fn run_as() -> Result<Option<RunAs>, TestkitError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    for name in ["postgres", "nobody"] {
        if let Some((uid, gid)) = lookup_user(name) {
            if uid != 0 {
                return Ok(Some(RunAs {
                    name: name.to_owned(),
                    uid,
                    gid,
                }));
            }
        }
    }
    Err(TestkitError::Cluster(
        "this process runs as root, which initdb and postgres refuse, and neither user \
         `postgres` nor `nobody` exists to run them as; create one (e.g. `useradd postgres`)"
            .to_owned(),
    ))
}

fn lookup_user(name: &str) -> Option<(u32, u32)> {
    let cname = CString::new(name).ok()?;
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: passwd is plain data; all-zero is a valid value to be overwritten.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is valid for the call, and `buf.len()` is the
    // length of `buf`; getpwnam_r writes only into `pwd` and `buf`.
    let rc = unsafe {
        libc::getpwnam_r(
            cname.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr(),
            buf.len(),
            &mut result,
        )
    };
    if rc != 0 || result.is_null() {
        return None;
    }
    Some((pwd.pw_uid, pwd.pw_gid))
}
