//! Reading the files users name: regular files only, since a device (`/dev/zero`), a FIFO or a directory named by a
//! path or a symlink would be read until memory runs out, or block forever. Writing files whole or not at all.

use std::fs;
use std::io::{BufWriter, Error, ErrorKind, Result};
use std::path::Path;

/// Replaces `path` atomically with what `write` writes: a temporary file beside it, flushed to disk and renamed over
/// it, then the directory synced, so `path` is the old file or the whole new one even if the machine stops. A
/// failed write (a full disk) removes the temporary file.
pub fn replace(path: &Path, write: impl FnOnce(&mut BufWriter<fs::File>) -> Result<()>) -> Result<()> {
    let tmp = path.with_extension("tmp");
    let whole = || -> Result<()> {
        let mut out = BufWriter::new(fs::File::create(&tmp)?);
        write(&mut out)?;
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        fs::rename(&tmp, path)
    };
    whole().inspect_err(|_| {
        let _ = fs::remove_file(&tmp);
    })?;
    match path.parent().filter(|d| !d.as_os_str().is_empty()) {
        Some(dir) => fs::File::open(dir)?.sync_all(),
        None => Ok(()),
    }
}

/// The whole file at `path` (symlinks followed), refusing anything but a regular file.
pub fn read(path: &Path) -> Result<Vec<u8>> {
    check_regular(path)?;
    fs::read(path)
}

/// A file's bytes: mapped (its pages read from disk as they are first touched, and held by the system's page cache,
/// which can drop them again), or read into memory.
pub enum Bytes {
    Mapped(memmap2::Mmap),
    Read(Vec<u8>),
}

impl std::ops::Deref for Bytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Bytes::Mapped(map) => map,
            Bytes::Read(bytes) => bytes,
        }
    }
}

impl From<Vec<u8>> for Bytes {
    fn from(bytes: Vec<u8>) -> Self {
        Bytes::Read(bytes)
    }
}

/// The file at `path` mapped into memory, refusing anything but a regular file: opening a 35 GB model reads only the
/// pages its reader touches, and loading it costs its memory once (the weights copied out of the page cache).
pub fn map(path: &Path) -> Result<Bytes> {
    check_regular(path)?;
    let file = fs::File::open(path)?;
    // SAFETY: the map is read-only. Like every reader that maps model files (llama.cpp, safetensors' Python
    // loader), it relies on no other process truncating the file while it is open, which would end this one with
    // SIGBUS; nothing here writes through it.
    let map = unsafe { memmap2::Mmap::map(&file)? };
    Ok(Bytes::Mapped(map))
}

/// Fails unless `path` is a regular file: a device such as /dev/zero would be read forever.
pub fn check_regular(path: &Path) -> Result<()> {
    match fs::metadata(path)?.is_file() {
        true => Ok(()),
        false => Err(Error::new(ErrorKind::InvalidInput, "not a regular file (a device, FIFO or directory)")),
    }
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
