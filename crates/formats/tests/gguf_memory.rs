//! Parsing a GGUF file takes memory in proportion to the file: metadata arrays keep their elements at their own
//! width (a byte array a byte per element, a vocabulary's strings in one buffer). Measured with a counting allocator
//! over files of 20 MB of byte-array metadata and of 1,000,000 one-character strings.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use ember_formats::gguf::Gguf;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let live = LIVE.fetch_add(layout.size(), Ordering::SeqCst) + layout.size();
        PEAK.fetch_max(live, Ordering::SeqCst);
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::SeqCst);
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// A GGUF v3 file without tensors whose one metadata key holds an array of `n` elements of GGUF type `item`, each
/// encoded as `element`.
fn gguf_with_array(item: u32, n: usize, element: &[u8]) -> Vec<u8> {
    let mut out = b"GGUF".to_vec();
    out.extend(3u32.to_le_bytes());
    out.extend(0u64.to_le_bytes());
    out.extend(1u64.to_le_bytes());
    out.extend(4u64.to_le_bytes());
    out.extend(b"big!");
    out.extend(9u32.to_le_bytes());
    out.extend(item.to_le_bytes());
    out.extend((n as u64).to_le_bytes());
    out.extend(element.repeat(n));
    out
}

/// The peak of live heap bytes while parsing `bytes` (the file's own copy included), over the file's size.
fn peak_ratio(bytes: Vec<u8>) -> f64 {
    let size = bytes.len();
    let before = LIVE.load(Ordering::SeqCst);
    PEAK.store(before, Ordering::SeqCst);
    let parsed = Gguf::parse(bytes).expect("a valid GGUF file");
    let peak = PEAK.load(Ordering::SeqCst) - before;
    drop(parsed);
    peak as f64 / size as f64
}

#[test]
fn metadata_takes_memory_in_proportion_to_the_file() {
    // Each case runs alone in this binary's one test, so no other thread allocates meanwhile.
    let bytes = peak_ratio(gguf_with_array(0, 20_000_000, &[7]));
    // A one-character string is 9 bytes in the file (length and byte).
    let strings = peak_ratio(gguf_with_array(8, 1_000_000, &[1, 0, 0, 0, 0, 0, 0, 0, b'a']));
    // The file's bytes are held while parsing, so 2× is the floor; a `Vec<Value>` took 33× for the byte array.
    assert!(bytes < 2.5, "parsing a byte array took {bytes:.1}× the file's size");
    assert!(strings < 2.5, "parsing a string array took {strings:.1}× the file's size");
}
