//! The modes of files created for a client, shared by the server and the fs helper
//! (SECURITY.md, "Created with final permissions").
//!
//! A file is born no wider than the mode it ends with: whoever opens a file keeps reading
//! it through that descriptor whatever its mode becomes later, so a file created wide and
//! narrowed afterwards hands what is written into it to anyone quick enough to open it in
//! between. Set-id bits are added last, once the owner and the content are final: changing
//! the owner or writing would clear them, and a half-written set-id file is not the file
//! that was asked for.

use std::fs::File;
use std::io;
use std::os::fd::BorrowedFd;

use rustix::fs::{Gid, Mode, Uid};

use crate::acl::Acl;

/// Read, write and execute for owner, group and others: no set-id or sticky bits.
const PERMISSION_BITS: u32 = 0o777;
/// The owner's read, write and execute bits.
const OWNER_BITS: u32 = 0o700;
/// Every mode bit `chmod` sets.
const MODE_BITS: u32 = 0o7777;
/// What a new file that copies no other file's mode is created with (the umask applies, so
/// this is also its final mode), as `File::create` does.
pub(crate) const NEW_FILE_MODE: u32 = 0o666;
/// The same for a new directory, as `mkdir -p` does.
pub(crate) const NEW_DIRECTORY_MODE: u32 = 0o777;

/// The mode to create a copy of a file whose mode is `source_mode` with: only its owner
/// bits. The copy's group (a set-group-id directory gives its own) and any ACL it inherits
/// from its directory are known only once it exists; [`prepare_copy`] then gives it the
/// rest of its permission bits, before any content is written, and [`finish_copy`] its
/// set-id bits once all of it is in.
pub(crate) fn copy_creation_mode(source_mode: u32) -> Mode {
    Mode::from_raw_mode(source_mode & OWNER_BITS)
}

/// Before a copy writes into `to`: removes any access ACL `to` has (one inherited from its
/// directory's default ACL, or an existing file's own), so that its mode alone says who may
/// read it; then gives a copy it `created` its permission bits, and narrows an existing
/// file (mode `to_mode`) to what both it and the source allow. The group's bits are the
/// source's only where `to` has the source's group.
pub(crate) fn prepare_copy(
    to: &File,
    created: bool,
    to_mode: u32,
    source: Owner,
) -> io::Result<()> {
    crate::acl::remove(to)?;
    let mut bits = source.mode & PERMISSION_BITS;
    if rustix::fs::fstat(to)?.st_gid != source.gid {
        bits &= !GROUP_BITS;
    }
    if created {
        return rustix::fs::fchmod(to, Mode::from_raw_mode(bits)).map_err(io::Error::from);
    }
    narrow_before_copy(to, to_mode, bits)
}

/// Before a copy writes into an existing file `to` (mode `to_mode`), narrows it to what
/// both it and the source allow, so the source's content is never readable there by
/// anyone the source denies. A file already no wider is left alone (changing a mode needs
/// ownership even when nothing changes).
pub(crate) fn narrow_before_copy(to: &File, to_mode: u32, source_mode: u32) -> io::Result<()> {
    let wider = to_mode & MODE_BITS & !(source_mode & PERMISSION_BITS);
    if wider == 0 {
        return Ok(());
    }
    let narrowed = to_mode & source_mode & PERMISSION_BITS;
    rustix::fs::fchmod(to, Mode::from_raw_mode(narrowed)).map_err(io::Error::from)
}

/// Gives a copy the source's mode once all of its content is in, the group's bits only
/// where it has the source's group. Set-id bits only come along where the copy has the
/// source's owner (set-user-id) or group (set-group-id), as `cp` does (a set-user-id
/// program of another user copied by a root server would otherwise become a set-user-id
/// *root* program), and only where nobody else could have written the content: the copy
/// made the file (`created`; an existing file may be held open for writing by anyone who
/// could once write it), it is the server's user's, and neither its group nor others may
/// write it.
pub(crate) fn finish_copy(to: &File, source: Owner, created: bool) -> io::Result<()> {
    let stat = rustix::fs::fstat(to)?;
    let mut mode = owned_bits(to, source)?;
    if stat.st_gid != source.gid {
        mode &= !GROUP_BITS;
    }
    if !created || written_by_others(&stat, mode) {
        mode &= !(SET_USER_ID | SET_GROUP_ID);
    }
    rustix::fs::fchmod(to, Mode::from_raw_mode(mode)).map_err(io::Error::from)
}

/// Whether someone other than the server's user could have written the file `stat`
/// describes, were it given the permission bits of `mode`.
fn written_by_others(stat: &rustix::fs::Stat, mode: u32) -> bool {
    stat.st_uid != rustix::process::geteuid().as_raw() || mode & (GROUP_WRITE | OTHER_WRITE) != 0
}

/// Whose a file was, and with which mode: what a copy or a new version may take over.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Owner {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// The bits of `owner.mode` that `file` may carry: set-user-id only if `file` belongs to
/// `owner.uid`, set-group-id only if its group is `owner.gid`.
fn owned_bits(file: &File, owner: Owner) -> io::Result<u32> {
    let stat = rustix::fs::fstat(file)?;
    let mut mode = owner.mode & MODE_BITS;
    if stat.st_uid != owner.uid {
        mode &= !SET_USER_ID;
    }
    if stat.st_gid != owner.gid {
        mode &= !SET_GROUP_ID;
    }
    Ok(mode)
}

/// `S_ISUID`.
const SET_USER_ID: u32 = 0o4000;
/// `S_ISGID`.
const SET_GROUP_ID: u32 = 0o2000;
/// The group's read, write and execute bits.
const GROUP_BITS: u32 = 0o070;

/// The mode to create a new version of a file with: only the owner bits of the existing
/// file's mode (`existing_mode`), or read and write for the owner for a file that does not
/// exist yet. The new version belongs to the server's user, and nobody else may open it,
/// until its content is final and [`adopt`] (or [`finish_new_file`]) gives it its owner
/// and permissions.
pub(crate) fn replacement_creation_mode(existing_mode: Option<u32>) -> Mode {
    match existing_mode {
        Some(mode) => Mode::from_raw_mode(mode & OWNER_BITS),
        None => Mode::from_raw_mode(NEW_FILE_MODE & OWNER_BITS),
    }
}

/// Gives a new version of a file that did not exist (in the directory `dir`) what a file
/// created there gets: its default ACL limited by `0666` where it has one (the umask plays
/// no part then), else `0666` less the process's umask (from `/proc/self/status`; where
/// that cannot be read, the owner's bits only, which is narrower). `present`: the mode of
/// a file someone put at the name since; the new version is then no wider than it, and
/// takes no ACL.
pub(crate) fn finish_new_file(
    file: &File,
    dir: BorrowedFd<'_>,
    present: Option<u32>,
) -> io::Result<()> {
    let plain = process_umask().map_or(NEW_FILE_MODE & OWNER_BITS, |umask| NEW_FILE_MODE & !umask);
    if let Some(present) = present {
        crate::acl::remove(file)?;
        let mode = plain & present & PERMISSION_BITS;
        return rustix::fs::fchmod(file, Mode::from_raw_mode(mode)).map_err(io::Error::from);
    }
    if let Some(default) = Acl::default_of(dir)? {
        return default.created_with(NEW_FILE_MODE).apply(file);
    }
    rustix::fs::fchmod(file, Mode::from_raw_mode(plain)).map_err(io::Error::from)
}

/// The process's umask, as the kernel reports it (Linux 4.7 and later).
fn process_umask() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find_map(|l| l.strip_prefix("Umask:"))?;
    u32::from_str_radix(line.trim(), 8).ok()
}

/// Makes `file` (created with [`replacement_creation_mode`]) take the existing file's
/// owner, where this process may give it away (otherwise it stays the server's user's),
/// and then its permissions: its access ACL (`acl`) where it has one and the owner and
/// group were taken, else its permission bits, the group's narrowed to the owning group's
/// own where an ACL made them a mask ([`acl`](crate::acl)). The set-id bits are for
/// [`restore_set_id`], once the content is written.
/// A new version that could not be given the existing group (an unprivileged server)
/// loses the group's bits: they were meant for another group.
pub(crate) fn adopt(file: &File, existing: Owner, acl: Option<&Acl>) -> io::Result<()> {
    // Only a privileged server may give the file to someone else.
    let _ = rustix::fs::fchown(
        file,
        Some(Uid::from_raw(existing.uid)),
        Some(Gid::from_raw(existing.gid)),
    );
    let stat = rustix::fs::fstat(file)?;
    let same_owner = (stat.st_uid, stat.st_gid) == (existing.uid, existing.gid);
    if let (Some(acl), true) = (acl, same_owner) {
        // One call sets the owner's, the group's and the others' bits and the mask, and
        // replaces whatever the new version inherited from its directory.
        return acl.apply(file);
    }
    // An ACL inherited from the directory's default ACL would keep its named entries.
    crate::acl::remove(file)?;
    let mut mode = crate::acl::mode_without_mask(acl, existing.mode) & PERMISSION_BITS;
    if stat.st_gid != existing.gid {
        mode &= !GROUP_BITS;
    }
    rustix::fs::fchmod(file, Mode::from_raw_mode(mode)).map_err(io::Error::from)
}

/// Adds the set-id and sticky bits of `existing.mode` to `file` (adopted with [`adopt`])
/// once its content is final, each set-id bit only where `file` did get the existing
/// owner or group, and only where nobody but the server could have written the new
/// version meanwhile: it belongs to the server's user and neither its group nor others
/// may write it. A new version that another user could write while the client wrote it
/// could carry their content under set-id bits they could never have set themselves; it
/// loses them instead. Nothing to do when the mode has none.
pub(crate) fn restore_set_id(file: &File, existing: Owner) -> io::Result<()> {
    if existing.mode & MODE_BITS & !PERMISSION_BITS == 0 {
        return Ok(());
    }
    let mut mode = owned_bits(file, existing)?;
    let stat = rustix::fs::fstat(file)?;
    let current = stat.st_mode & PERMISSION_BITS;
    // Keep what `adopt` took away from the group's bits.
    mode = (mode & !PERMISSION_BITS) | current;
    if written_by_others(&stat, current) {
        mode &= !(SET_USER_ID | SET_GROUP_ID);
    }
    rustix::fs::fchmod(file, Mode::from_raw_mode(mode)).map_err(io::Error::from)
}

/// `S_IWGRP`, `S_IWOTH`.
const GROUP_WRITE: u32 = 0o020;
const OTHER_WRITE: u32 = 0o002;

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode_of(file: &File) -> u32 {
        file.metadata().unwrap().permissions().mode() & MODE_BITS
    }

    #[test]
    fn creation_modes_are_never_wider_than_the_final_ones() {
        for mode in [0o600, 0o640, 0o755, 0o4755, 0o2750, 0o1777, 0o000] {
            let copy = copy_creation_mode(mode).bits();
            assert_eq!(
                copy & !(mode & OWNER_BITS),
                0,
                "copy of {mode:o} created {copy:o}"
            );
            let replacement = replacement_creation_mode(Some(mode)).bits();
            assert_eq!(replacement & !(mode & OWNER_BITS), 0, "{replacement:o}");
        }
        assert_eq!(replacement_creation_mode(None).bits(), 0o600);
    }

    #[test]
    fn a_wider_destination_is_narrowed_and_a_narrower_one_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        let file = File::create(&path).unwrap();
        file.set_permissions(std::fs::Permissions::from_mode(0o664))
            .unwrap();
        narrow_before_copy(&file, 0o100664, 0o600).unwrap();
        assert_eq!(mode_of(&file), 0o600);
        narrow_before_copy(&file, 0o100600, 0o644).unwrap();
        assert_eq!(mode_of(&file), 0o600);
        let (uid, gid) = ids();
        let source = |mode| Owner { mode, uid, gid };
        finish_copy(&file, source(0o100644), false).unwrap();
        assert_eq!(mode_of(&file), 0o644);
        // An existing file never gets set-id bits: it may be held open for writing.
        finish_copy(&file, source(0o104755), false).unwrap();
        assert_eq!(mode_of(&file), 0o755);
        finish_copy(&file, source(0o104755), true).unwrap();
        assert_eq!(mode_of(&file), 0o4755);
        // Nor one its group or others may write.
        finish_copy(&file, source(0o102775), true).unwrap();
        assert_eq!(mode_of(&file), 0o775);
    }

    fn ids() -> (u32, u32) {
        // SAFETY: geteuid and getegid have no preconditions.
        unsafe { (libc::geteuid(), libc::getegid()) }
    }

    #[test]
    fn set_id_bits_come_only_with_restore_set_id() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        let (uid, gid) = ids();
        let existing = Owner {
            mode: 0o4750,
            uid,
            gid,
        };
        adopt(&file, existing, None).unwrap();
        assert_eq!(mode_of(&file), 0o750);
        restore_set_id(&file, existing).unwrap();
        assert_eq!(mode_of(&file), 0o4750);
    }

    #[test]
    fn set_id_bits_of_someone_else_never_come_along() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        let (uid, gid) = ids();
        // A source of another user and group: the copy keeps its permission bits only.
        let foreign = Owner {
            mode: 0o106755,
            uid: uid.wrapping_add(1),
            gid: gid.wrapping_add(1),
        };
        finish_copy(&file, foreign, true).unwrap();
        // Another group's bits are not for this file's group either.
        assert_eq!(mode_of(&file), 0o705);
        let own_group = Owner { gid, ..foreign };
        finish_copy(&file, own_group, true).unwrap();
        assert_eq!(mode_of(&file), 0o2755);
    }
}
