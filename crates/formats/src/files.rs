//! Reading the files users name: regular files only, since a device (`/dev/zero`), a FIFO or a directory named by a
//! path or a symlink would be read until memory runs out, or block forever.

use std::fs;
use std::io::{Error, ErrorKind, Result};
use std::path::Path;

/// The whole file at `path` (symlinks followed), refusing anything but a regular file.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    if !fs::metadata(path)?.is_file() {
        return Err(Error::new(ErrorKind::InvalidInput, "not a regular file (a device, FIFO or directory)"));
    }
    fs::read(path)
}

/// [`read`] as UTF-8 text.
pub fn read_to_string(path: &Path) -> Result<String> {
    String::from_utf8(read(path)?).map_err(|e| {
        Error::new(
            ErrorKind::InvalidData,
            format!("not UTF-8 text (invalid byte at offset {})", e.utf8_error().valid_up_to()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_and_directories_are_refused_and_files_read() {
        for path in ["/dev/zero", "/tmp"] {
            let err = read(Path::new(path)).unwrap_err();
            assert_eq!(err.to_string(), "not a regular file (a device, FIFO or directory)", "{path}");
        }
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("zero.json");
        std::os::unix::fs::symlink("/dev/zero", &link).unwrap();
        assert!(read_to_string(&link).is_err());
        let file = dir.path().join("a.txt");
        fs::write(&file, "abc").unwrap();
        assert_eq!(read_to_string(&file).unwrap(), "abc");
    }
}
