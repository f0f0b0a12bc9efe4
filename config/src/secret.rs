//! Holding secrets: a string that never prints itself, the reader for files that hold one
//! (token and key files), which refuses files that group or others may read or write, and
//! the comparison that takes as long whatever the secret's contents.

use std::fmt;
use std::io::Read as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use zeroize::Zeroize as _;

/// How secrets are printed by `exec-server config`, logs and `Debug`.
pub const REDACTED: &str = "<redacted>";

/// Largest secret file read: tokens and keys are a few dozen bytes; anything this large is
/// the wrong file, and reading it whole would be an unbounded buffer.
pub const MAX_SECRET_FILE_BYTES: u64 = 64 * 1024;

/// A secret (bearer token, key). `Debug` and `Serialize` print `<redacted>`, deserialising
/// never echoes the offending value, and the bytes are zeroed when it is dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretString(String);

impl SecretString {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret itself: for the comparison or the header that needs it, never for output.
    pub fn expose(&self) -> &str {
        &self.0
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl Drop for SecretString {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for SecretString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(REDACTED)
    }
}

impl Serialize for SecretString {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(REDACTED)
    }
}

impl<'de> Deserialize<'de> for SecretString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        // `any`: the visitor, not the format, words the error for a value of the wrong type.
        deserializer.deserialize_any(SecretVisitor)
    }
}

/// Accepts strings only; every other type is refused without quoting the value, which
/// serde's default "invalid type: found `…`" message would do.
struct SecretVisitor;

impl SecretVisitor {
    fn refuse<E: de::Error>() -> Result<SecretString, E> {
        Err(E::custom("must be a string"))
    }
}

impl<'de> Visitor<'de> for SecretVisitor {
    type Value = SecretString;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<SecretString, E> {
        Ok(SecretString::new(value))
    }

    fn visit_string<E: de::Error>(self, value: String) -> Result<SecretString, E> {
        Ok(SecretString(value))
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<SecretString, E> {
        Self::refuse()
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<SecretString, E> {
        Self::refuse()
    }

    fn visit_i128<E: de::Error>(self, _: i128) -> Result<SecretString, E> {
        Self::refuse()
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<SecretString, E> {
        Self::refuse()
    }

    fn visit_u128<E: de::Error>(self, _: u128) -> Result<SecretString, E> {
        Self::refuse()
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<SecretString, E> {
        Self::refuse()
    }

    fn visit_char<E: de::Error>(self, value: char) -> Result<SecretString, E> {
        Ok(SecretString(value.to_string()))
    }

    fn visit_bytes<E: de::Error>(self, _: &[u8]) -> Result<SecretString, E> {
        Self::refuse()
    }

    fn visit_unit<E: de::Error>(self) -> Result<SecretString, E> {
        Self::refuse()
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, _: A) -> Result<SecretString, A::Error> {
        Self::refuse()
    }

    fn visit_map<A: de::MapAccess<'de>>(self, _: A) -> Result<SecretString, A::Error> {
        Self::refuse()
    }
}

/// Why a secret file was refused.
#[derive(Debug)]
pub enum SecretFileError {
    /// Group or others may read or write it (`mode` is the permission bits).
    TooOpen {
        mode: u32,
    },
    TooLarge,
    /// Not a regular file (a FIFO would block the reader, a device is no secret).
    NotRegular,
    /// Owned by another user than the one reading it: whoever owns it chooses the secret.
    NotOwned {
        owner: u32,
    },
    Io(std::io::Error),
}

impl SecretFileError {
    /// The problem as the rest of an `invalid config: <key> <path> …` line.
    pub fn describe(&self, path: &Path) -> String {
        match self {
            Self::TooOpen { mode } => format!(
                "{} is readable or writable by group or others (mode {mode:04o}); fix it with `chmod 600 {}`",
                path.display(),
                path.display()
            ),
            Self::TooLarge => format!(
                "{} is larger than {MAX_SECRET_FILE_BYTES} bytes; it cannot be a token or key file",
                path.display()
            ),
            Self::NotRegular => format!(
                "{} is not a regular file; a token or key file must be one",
                path.display()
            ),
            Self::NotOwned { owner } => format!(
                "{} belongs to user {owner}, not to the user reading it ({}); fix it with `chown {} {}`",
                path.display(),
                rustix::process::geteuid().as_raw(),
                rustix::process::geteuid().as_raw(),
                path.display()
            ),
            Self::Io(e) => format!("{} cannot be read: {e}", path.display()),
        }
    }
}

/// Refuses a file that group or others may read or write (symbolic links are followed: the
/// target's mode is what protects the secret).
pub fn check_secret_file_mode(path: &Path) -> Result<(), SecretFileError> {
    let metadata = std::fs::metadata(path).map_err(SecretFileError::Io)?;
    check_secret_metadata(&metadata)
}

/// A secret file is a regular file of the reading user that only that user may read or
/// write.
fn check_secret_metadata(metadata: &std::fs::Metadata) -> Result<(), SecretFileError> {
    use std::os::unix::fs::MetadataExt as _;
    if !metadata.is_file() {
        return Err(SecretFileError::NotRegular);
    }
    let mode = metadata.permissions().mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Err(SecretFileError::TooOpen { mode });
    }
    if metadata.uid() != rustix::process::geteuid().as_raw() {
        return Err(SecretFileError::NotOwned {
            owner: metadata.uid(),
        });
    }
    Ok(())
}

/// Reads a token or key file: the mode is checked on the opened file, so the file read is
/// the file checked.
pub fn read_secret_file(path: &Path) -> Result<Vec<u8>, SecretFileError> {
    use std::os::unix::fs::OpenOptionsExt as _;
    // Non-blocking, so that opening a FIFO returns at once and is then refused.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(path)
        .map_err(SecretFileError::Io)?;
    let metadata = file.metadata().map_err(SecretFileError::Io)?;
    check_secret_metadata(&metadata)?;
    let mut bytes = Vec::new();
    file.take(MAX_SECRET_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(SecretFileError::Io)?;
    if bytes.len() as u64 > MAX_SECRET_FILE_BYTES {
        bytes.zeroize();
        return Err(SecretFileError::TooLarge);
    }
    Ok(bytes)
}

/// Reads a token file: UTF-8, surrounding whitespace (a trailing newline) removed.
pub fn read_token_file(path: &Path) -> Result<SecretString, SecretFileError> {
    let bytes = read_secret_file(path)?;
    let text = String::from_utf8(bytes).map_err(|e| {
        let mut bytes = e.into_bytes();
        bytes.zeroize();
        SecretFileError::Io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "the token is not UTF-8",
        ))
    })?;
    let token = SecretString::new(text.trim());
    drop(SecretString(text));
    Ok(token)
}

/// Equality of two byte strings in time that depends on their lengths only, for comparing
/// a presented secret (or its digest) with the expected one.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with_mode(contents: &str, mode: u32) -> tempfile::TempPath {
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), contents).unwrap();
        std::fs::set_permissions(file.path(), std::fs::Permissions::from_mode(mode)).unwrap();
        file.into_temp_path()
    }

    #[test]
    fn owner_only_files_are_read_and_trimmed() {
        for mode in [0o600, 0o400, 0o700] {
            let path = file_with_mode("  tok-1\n", mode);
            assert_eq!(read_token_file(&path).unwrap().expose(), "tok-1");
        }
    }

    #[test]
    fn group_or_other_access_is_refused_with_the_fix() {
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602, 0o660, 0o666] {
            let path = file_with_mode("tok", mode);
            let error = read_token_file(&path).unwrap_err();
            assert!(
                matches!(error, SecretFileError::TooOpen { mode: m } if m == mode),
                "{mode:o}: {error:?}"
            );
            let text = error.describe(&path);
            assert!(text.contains(&format!("mode {mode:04o}")), "{text}");
            assert!(
                text.contains(&format!("chmod 600 {}", path.display())),
                "{text}"
            );
            assert!(!text.contains("tok\n") && !text.ends_with("tok"), "{text}");
            assert!(check_secret_file_mode(&path).is_err());
        }
    }

    #[test]
    fn a_link_is_judged_by_its_target() {
        let target = file_with_mode("tok", 0o644);
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        assert!(matches!(
            read_secret_file(&link),
            Err(SecretFileError::TooOpen { mode: 0o644 })
        ));
    }

    #[test]
    fn oversized_and_missing_files_are_refused() {
        let big = file_with_mode(&"x".repeat(MAX_SECRET_FILE_BYTES as usize + 1), 0o600);
        assert!(matches!(
            read_secret_file(&big),
            Err(SecretFileError::TooLarge)
        ));
        let error = read_secret_file(Path::new("/nonexistent/token")).unwrap_err();
        assert!(matches!(error, SecretFileError::Io(_)));
    }

    #[test]
    fn a_fifo_is_refused_at_once_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("token");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        // Without a writer, a blocking open would never return.
        assert!(matches!(
            read_secret_file(&fifo),
            Err(SecretFileError::NotRegular)
        ));
        assert!(matches!(
            check_secret_file_mode(&fifo),
            Err(SecretFileError::NotRegular)
        ));
        let text = SecretFileError::NotRegular.describe(&fifo);
        assert!(text.contains("not a regular file"), "{text}");
    }

    #[test]
    fn a_file_of_another_user_is_refused_with_the_fix() {
        let path = file_with_mode("tok", 0o600);
        let me = rustix::process::geteuid();
        if !me.is_root() {
            // Only root can give a file away; the rule is the same for every reader.
            return;
        }
        std::os::unix::fs::chown(&path, Some(65534), None).unwrap();
        let error = read_secret_file(&path).unwrap_err();
        assert!(
            matches!(error, SecretFileError::NotOwned { owner: 65534 }),
            "{error:?}"
        );
        let text = error.describe(&path);
        assert!(
            text.contains("belongs to user 65534") && text.contains("chown 0 "),
            "{text}"
        );
    }

    #[test]
    fn secrets_never_print_themselves() {
        let secret = SecretString::new("hunter2");
        assert_eq!(format!("{secret:?}"), "<redacted>");
        assert_eq!(serde_json::to_value(&secret).unwrap(), "<redacted>");
        let error = serde_json::from_str::<SecretString>("12345").unwrap_err();
        assert!(!error.to_string().contains("12345"), "{error}");
        assert_eq!(
            serde_json::from_str::<SecretString>("\"abc\"")
                .unwrap()
                .expose(),
            "abc"
        );
    }
}
