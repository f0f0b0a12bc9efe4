use std::os::unix::fs::PermissionsExt;

use super::*;

fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

#[test]
fn the_target_changes_only_at_the_commit_and_keeps_its_mode() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("t");
    std::fs::write(&target, b"old").unwrap();
    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
    let file = ReplaceFile::open(&target).unwrap();
    file.write_at(b"new", 0).unwrap().unwrap();
    file.write_at(b"!", 5).unwrap().unwrap();
    assert_eq!(std::fs::read(&target).unwrap(), b"old");
    assert_eq!(names(dir.path()).len(), 2);
    file.commit().unwrap();
    assert!(file.write_at(b"late", 0).is_none());
    drop(file);
    assert_eq!(std::fs::read(&target).unwrap(), b"new\0\0!");
    let mode = std::fs::metadata(&target).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o640);
    assert_eq!(names(dir.path()), ["t"]);
}

#[test]
fn an_uncommitted_version_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("t");
    let file = ReplaceFile::open(&target).unwrap();
    file.write_at(b"x", 0).unwrap().unwrap();
    assert_eq!(names(dir.path()).len(), 1, "only the temporary file");
    drop(file);
    assert!(names(dir.path()).is_empty());
}

#[test]
fn a_last_link_is_followed_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("d")).unwrap();
    std::fs::write(dir.path().join("d/real"), b"old").unwrap();
    std::os::unix::fs::symlink("d/real", dir.path().join("link")).unwrap();
    let file = ReplaceFile::open(&dir.path().join("link")).unwrap();
    file.write_at(b"new", 0).unwrap().unwrap();
    file.commit().unwrap();
    assert!(std::fs::symlink_metadata(dir.path().join("link"))
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(std::fs::read(dir.path().join("d/real")).unwrap(), b"new");
    // A dangling link creates its target.
    std::os::unix::fs::symlink("d/fresh", dir.path().join("dangling")).unwrap();
    let file = ReplaceFile::open(&dir.path().join("dangling")).unwrap();
    file.write_at(b"f", 0).unwrap().unwrap();
    file.commit().unwrap();
    assert_eq!(std::fs::read(dir.path().join("d/fresh")).unwrap(), b"f");
}

#[test]
fn directories_specials_and_loops_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let error = ReplaceFile::open(dir.path()).unwrap_err();
    assert_eq!(error.message, "Is a directory (os error 21)");
    assert_eq!(error.code, -32603);
    let null = ReplaceFile::open(Path::new("/dev/null")).unwrap_err();
    assert_eq!(null, RpcError::not_a_file("/dev/null"));
    std::os::unix::fs::symlink("loop", dir.path().join("loop")).unwrap();
    let error = ReplaceFile::open(&dir.path().join("loop")).unwrap_err();
    assert!(error.message.ends_with("(os error 40)"), "{error:?}");
    let error = ReplaceFile::open(&dir.path().join("missing/t")).unwrap_err();
    assert_eq!(error.code, -32004, "{error:?}");
    assert!(names(dir.path()) == ["loop"]);
}

#[test]
fn a_directory_swapped_after_the_open_redirects_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let outside = dir.path().join("outside");
    std::fs::create_dir(&work).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(work.join("t"), b"old").unwrap();
    let file = ReplaceFile::open(&work.join("t")).unwrap();
    file.write_at(b"new", 0).unwrap().unwrap();
    std::fs::rename(&work, dir.path().join("moved")).unwrap();
    std::os::unix::fs::symlink(&outside, &work).unwrap();
    file.commit().unwrap();
    assert!(names(&outside).is_empty());
    assert_eq!(std::fs::read(dir.path().join("moved/t")).unwrap(), b"new");
}
