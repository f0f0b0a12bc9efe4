//! POSIX access ACLs (`system.posix_acl_access`) of the files a new one is made from.
//!
//! With an ACL, the group bits of a file's mode are the ACL's *mask*: the most any named
//! user or group, or the owning group, may have, not what the owning group has. A file made
//! from such a file with its mode alone would give the owning group the mask (the ACL
//! denied it more). So a new version of a file (`replace`) takes the whole ACL, and a copy,
//! which takes no ACL (as `cp` without `-p`), takes the owning group's own bits; named
//! users and groups lose their access, which is narrower, never wider.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

const ACCESS_ACL: &str = "system.posix_acl_access";
const DEFAULT_ACL: &str = "system.posix_acl_default";
/// An ACL of more entries than this is not one a file system stores.
const MAX_ACL_BYTES: usize = 4 + 8 * 4096;
/// Entry tags (`linux/posix_acl_xattr.h`).
const USER_OBJ: u16 = 0x01;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;
/// Header: a little-endian version; then entries of tag (u16), perm (u16), id (u32).
const HEADER_BYTES: usize = 4;
const ENTRY_BYTES: usize = 8;

/// A file's access ACL, as the kernel stores it.
#[derive(Debug, Clone)]
pub(crate) struct Acl(Vec<u8>);

impl Acl {
    /// The access ACL of the file `file` is open on, if it has one.
    pub(crate) fn of(file: &File) -> io::Result<Option<Self>> {
        let mut value = vec![0u8; MAX_ACL_BYTES];
        let read = rustix::fs::fgetxattr(file, ACCESS_ACL, &mut value[..]);
        Self::from_read(read, value)
    }

    /// The same through a descriptor of any kind (`O_PATH` included).
    pub(crate) fn of_descriptor(fd: BorrowedFd<'_>) -> io::Result<Option<Self>> {
        Self::named(fd, ACCESS_ACL)
    }

    /// The default ACL of the directory `dir` is open on (what new files in it inherit),
    /// if it has one.
    pub(crate) fn default_of(dir: BorrowedFd<'_>) -> io::Result<Option<Self>> {
        Self::named(dir, DEFAULT_ACL)
    }

    fn named(fd: BorrowedFd<'_>, name: &str) -> io::Result<Option<Self>> {
        let path = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let mut value = vec![0u8; MAX_ACL_BYTES];
        let read = rustix::fs::getxattr(path.as_str(), name, &mut value[..]);
        Self::from_read(read, value)
    }

    /// The access ACL the kernel gives a file created with `mode` in a directory of this
    /// default ACL: the owner's, the mask's (the owning group's where there is no mask)
    /// and the others' entries limited by `mode`; the umask plays no part.
    pub(crate) fn created_with(&self, mode: u32) -> Self {
        let mut bytes = self.0.clone();
        let has_mask = self.entries().any(|(tag, _)| tag == MASK);
        for entry in bytes
            .get_mut(HEADER_BYTES..)
            .unwrap_or_default()
            .chunks_exact_mut(ENTRY_BYTES)
        {
            let tag = u16::from_le_bytes([entry[0], entry[1]]);
            let limit = match tag {
                USER_OBJ => mode >> 6,
                MASK => mode >> 3,
                GROUP_OBJ if !has_mask => mode >> 3,
                OTHER => mode,
                _ => continue,
            } & 0o7;
            let perm = u16::from_le_bytes([entry[2], entry[3]]) & limit as u16;
            entry[2..4].copy_from_slice(&perm.to_le_bytes());
        }
        Self(bytes)
    }

    /// Each entry's tag and permissions.
    fn entries(&self) -> impl Iterator<Item = (u16, u32)> + '_ {
        let entries = self.0.get(HEADER_BYTES..).unwrap_or_default();
        entries.chunks_exact(ENTRY_BYTES).map(|entry| {
            let tag = u16::from_le_bytes([entry[0], entry[1]]);
            let perm = u32::from(u16::from_le_bytes([entry[2], entry[3]])) & 0o7;
            (tag, perm)
        })
    }

    fn from_read(read: rustix::io::Result<usize>, mut value: Vec<u8>) -> io::Result<Option<Self>> {
        match read {
            Ok(len) => {
                value.truncate(len);
                Ok(Some(Self(value)))
            }
            // No ACL, or a file system without them: the mode says it all.
            Err(rustix::io::Errno::NODATA | rustix::io::Errno::OPNOTSUPP) => Ok(None),
            Err(error) => Err(error.into()),
        }
    }

    /// Gives `file` this ACL (its group bits become the mask again).
    pub(crate) fn apply(&self, file: &File) -> io::Result<()> {
        let flags = rustix::fs::XattrFlags::empty();
        rustix::fs::fsetxattr(file, ACCESS_ACL, &self.0, flags).map_err(io::Error::from)
    }

    /// The owning group's own bits (its entry, limited by the mask), as `rwx` in the low
    /// three bits; `None` when the ACL cannot be read as one.
    fn owning_group_bits(&self) -> Option<u32> {
        let entries = self.0.get(HEADER_BYTES..)?;
        if entries.len() % ENTRY_BYTES != 0 {
            return None;
        }
        let (mut group, mut mask) = (None, 0o7);
        for (tag, perm) in self.entries() {
            match tag {
                GROUP_OBJ => group = Some(perm),
                MASK => mask = perm,
                _ => {}
            }
        }
        group.map(|group| group & mask)
    }
}

/// Removes `file`'s access ACL, if it has one: its mode alone then says who may use it
/// (the group's bits become the owning group's, from the mask).
pub(crate) fn remove(file: &File) -> io::Result<()> {
    // Only where there is one: removing needs ownership even when there is nothing to
    // remove, and a copy may write into a file the server may write but does not own.
    if Acl::of(file)?.is_none() {
        return Ok(());
    }
    match rustix::fs::fremovexattr(file, ACCESS_ACL) {
        Ok(()) | Err(rustix::io::Errno::NODATA | rustix::io::Errno::OPNOTSUPP) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// The mode a copy of `source` (open, with mode `mode`) may have: with an ACL, its group
/// bits are the owning group's own, not the mask; an ACL that cannot be read leaves the
/// group nothing.
pub(crate) fn copy_mode(source: &File, mode: u32) -> io::Result<u32> {
    Ok(mode_without_mask(Acl::of(source)?.as_ref(), mode))
}

/// `mode` with its group bits the owning group's own when `acl` made them a mask.
pub(crate) fn mode_without_mask(acl: Option<&Acl>, mode: u32) -> u32 {
    let Some(acl) = acl else {
        return mode;
    };
    let group = acl.owning_group_bits().unwrap_or(0);
    (mode & !0o070) | (group << 3)
}

/// The access ACL of `fd`'s file, for a new version of it.
pub(crate) fn of_target(fd: impl AsFd) -> io::Result<Option<Acl>> {
    Acl::of_descriptor(fd.as_fd())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `u::rw-, u:1000:r--, g::---, m::r--, o::---`, as the kernel stores it.
    fn acl() -> Acl {
        let mut bytes = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in [
            (0x01u16, 6u16, u32::MAX),
            (0x02, 4, 1000),
            (GROUP_OBJ, 0, u32::MAX),
            (MASK, 4, u32::MAX),
            (0x20, 0, u32::MAX),
        ] {
            bytes.extend(tag.to_le_bytes());
            bytes.extend(perm.to_le_bytes());
            bytes.extend(id.to_le_bytes());
        }
        Acl(bytes)
    }

    #[test]
    fn a_copy_takes_the_owning_group_s_bits_not_the_mask() {
        assert_eq!(acl().owning_group_bits(), Some(0));
        assert_eq!(mode_without_mask(Some(&acl()), 0o100640), 0o100600);
        assert_eq!(mode_without_mask(None, 0o100640), 0o100640);
        let unreadable = Acl(vec![2, 0, 0, 0, 1]);
        assert_eq!(mode_without_mask(Some(&unreadable), 0o100750), 0o100700);
    }

    #[test]
    fn a_created_file_s_acl_is_the_default_limited_by_its_mode() {
        // `u::rw-, u:1000:r--, g::---, m::r--, o::---` limited by 0600: the mask goes.
        let created = acl().created_with(0o600);
        let perms: Vec<(u16, u32)> = created.entries().collect();
        assert_eq!(
            perms,
            [(0x01, 6), (0x02, 4), (GROUP_OBJ, 0), (MASK, 0), (OTHER, 0)]
        );
        let open = acl().created_with(0o666);
        assert_eq!(
            open.entries().collect::<Vec<_>>(),
            acl().entries().collect::<Vec<_>>()
        );
    }

    #[test]
    fn a_new_version_takes_the_whole_acl() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("f")).unwrap();
        assert!(Acl::of(&file).unwrap().is_none());
        match acl().apply(&file) {
            // A file system without ACLs (tmpfs without them, some containers).
            Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => return,
            result => result.unwrap(),
        }
        let copied = Acl::of(&file).unwrap().expect("an ACL");
        assert_eq!(copied.owning_group_bits(), Some(0));
        let target = rustix::fs::open(
            dir.path().join("f"),
            rustix::fs::OFlags::PATH,
            rustix::fs::Mode::empty(),
        )
        .unwrap();
        assert!(of_target(&target).unwrap().is_some());
    }
}
