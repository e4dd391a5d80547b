//! The global allocator: the system's, except that freed blocks of 4 MiB and more are kept (up to a budget, set by
//! `EMBER_ALLOC_CACHE_MIB`, 0 to keep none) and handed back to the next request of the same size and alignment. glibc maps blocks above its mmap threshold
//! (at most 32 MiB) directly and unmaps them on free, and returns the top of its heap to the system when more than
//! twice that is free, so each step of training at nanoGPT's shape (activations of 25 and 100 MB) page-faulted and
//! zeroed its tensors afresh: a fifth of the step's time for the 100 MB ones, ~200,000 faults per step for the
//! 25 MB ones. Smaller blocks (all of the baby GPT's) stay with glibc.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Blocks at least this large are recycled.
const LARGE: usize = 4 << 20;
/// At most this many bytes wait in the cache by default (the oldest go back to the system first).
const BUDGET: usize = 4 << 30;
/// The environment variable that sets the budget in MiB.
pub const BUDGET_VARIABLE: &str = "EMBER_ALLOC_CACHE_MIB";
/// At most this many blocks wait in the cache.
const SLOTS: usize = 256;

struct Cache {
    /// (size, align, address) of each free block, oldest first.
    blocks: [(usize, usize, usize); SLOTS],
    len: usize,
    bytes: usize,
}

impl Cache {
    /// A kept block of exactly `layout`, taken out of the cache.
    fn take(&mut self, layout: Layout) -> Option<*mut u8> {
        let at = self.blocks[..self.len].iter().rposition(|&(s, a, _)| s == layout.size() && a == layout.align())?;
        let (size, _, ptr) = self.blocks[at];
        self.blocks.copy_within(at + 1..self.len, at);
        self.len -= 1;
        self.bytes -= size;
        Some(ptr as *mut u8)
    }

    /// Keeps the block, returning the oldest kept blocks to the system while the cache is over its slots or
    /// `budget`; false (the caller frees it) for a block larger than the whole budget.
    fn keep(&mut self, ptr: *mut u8, layout: Layout, budget: usize) -> bool {
        if layout.size() > budget {
            return false;
        }
        while self.len == SLOTS || self.bytes + layout.size() > budget {
            let (size, align, old) = self.blocks[0];
            self.blocks.copy_within(1..self.len, 0);
            self.len -= 1;
            self.bytes -= size;
            // SAFETY: a kept block came from System with this size and alignment.
            unsafe { System.dealloc(old as *mut u8, Layout::from_size_align_unchecked(size, align)) };
        }
        self.blocks[self.len] = (layout.size(), layout.align(), ptr as usize);
        self.len += 1;
        self.bytes += layout.size();
        true
    }
}

/// Keeps freed memory in glibc's heaps (blocks below [`LARGE`]) instead of returning it to the system: a fixed mmap
/// threshold of [`LARGE`] (bigger blocks are recycled here) and trimming only past 1 GiB of free heap. By default
/// glibc trims free memory beyond twice its (dynamic) mmap threshold, so training the baby GPT faulted ~3,900 fresh
/// pages into its 1.5 MB activations every step. Elsewhere nothing to tune.
pub fn keep_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets glibc's allocation parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, LARGE as libc::c_int);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 30);
    }
}

/// The process' allocator.
#[global_allocator]
pub static ALLOCATOR: Recycling = Recycling::new();

/// Returns the memory freed while loading a model to the system ([`Recycling::release`]).
pub fn release_load_buffers() {
    ALLOCATOR.release();
}

/// The system allocator with large freed blocks recycled.
pub struct Recycling {
    cache: Mutex<Cache>,
    budget: AtomicUsize,
}

impl Recycling {
    pub const fn new() -> Self {
        Self {
            cache: Mutex::new(Cache { blocks: [(0, 0, 0); SLOTS], len: 0, bytes: 0 }),
            budget: AtomicUsize::new(BUDGET),
        }
    }

    /// Bytes of freed blocks kept at most from now on (blocks kept beyond it go back as others are freed).
    pub fn set_budget(&self, bytes: usize) {
        self.budget.store(bytes, Ordering::Relaxed);
    }

    /// The budget [`BUDGET_VARIABLE`] asks for, in MiB; an error names a value that is not a whole number.
    pub fn budget_from_env() -> Result<Option<usize>, String> {
        match std::env::var(BUDGET_VARIABLE) {
            Err(_) => Ok(None),
            Ok(v) => v
                .trim()
                .parse::<usize>()
                .ok()
                .and_then(|mib| mib.checked_mul(1 << 20))
                .map(Some)
                .ok_or_else(|| format!("{BUDGET_VARIABLE}={v}: expected a whole number of MiB")),
        }
    }

    /// Returns every kept block, and glibc's free heap, to the system: called once a model is loaded, so the
    /// buffers of loading (a GGUF file read whole, the copies its matrices were made from) leave the resident set.
    pub fn release(&self) {
        if let Ok(mut cache) = self.cache.lock() {
            for &(size, align, ptr) in &cache.blocks[..cache.len] {
                // SAFETY: a kept block came from System with this size and alignment.
                unsafe { System.dealloc(ptr as *mut u8, Layout::from_size_align_unchecked(size, align)) };
            }
            (cache.len, cache.bytes) = (0, 0);
        }
        #[cfg(all(target_os = "linux", target_env = "gnu"))]
        // SAFETY: malloc_trim only returns free heap pages to the system.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    fn reuse(&self, layout: Layout) -> Option<*mut u8> {
        if layout.size() < LARGE {
            return None;
        }
        self.cache.lock().ok()?.take(layout)
    }
}

unsafe impl GlobalAlloc for Recycling {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the layout is passed on unchanged; a reused block was allocated by System with this same layout.
        self.reuse(layout).unwrap_or_else(|| unsafe { System.alloc(layout) })
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        match self.reuse(layout) {
            // SAFETY: the block holds layout.size() bytes.
            Some(ptr) => unsafe {
                ptr.write_bytes(0, layout.size());
                ptr
            },
            // SAFETY: as in alloc.
            None => unsafe { System.alloc_zeroed(layout) },
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: new_size with layout's alignment is a valid layout (GlobalAlloc::realloc's contract).
        let new_layout = unsafe { Layout::from_size_align_unchecked(new_size, layout.align()) };
        match self.reuse(new_layout) {
            // SAFETY: both blocks hold at least the copied bytes; ptr is freed after the copy.
            Some(new) => unsafe {
                new.copy_from_nonoverlapping(ptr, layout.size().min(new_size));
                self.dealloc(ptr, layout);
                new
            },
            // SAFETY: ptr came from System with this layout.
            None => unsafe { System.realloc(ptr, layout, new_size) },
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let budget = self.budget.load(Ordering::Relaxed);
        let kept = layout.size() >= LARGE
            && budget >= LARGE
            && self.cache.lock().is_ok_and(|mut cache| cache.keep(ptr, layout, budget));
        if !kept {
            // SAFETY: ptr came from System (directly or through the cache) with this layout.
            unsafe { System.dealloc(ptr, layout) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_freed_large_block_serves_the_next_request_of_its_size_zeroed_when_asked() {
        let recycling = Recycling::new();
        let (big, bigger) =
            (Layout::from_size_align(LARGE, 64).unwrap(), Layout::from_size_align(LARGE + 64, 64).unwrap());
        // SAFETY: every block is freed once with the layout it was allocated with.
        unsafe {
            let first = recycling.alloc(big);
            first.write_bytes(7, LARGE);
            recycling.dealloc(first, big);
            let other = recycling.alloc(bigger);
            assert_ne!(other, first, "a block of another size is not reused");
            let again = recycling.alloc_zeroed(big);
            assert_eq!(again, first);
            assert!(std::slice::from_raw_parts(again, LARGE).iter().all(|&b| b == 0));
            recycling.dealloc(again, big);
            recycling.dealloc(other, bigger);
        }
    }

    #[test]
    fn the_cache_returns_its_oldest_blocks_beyond_its_slots() {
        let recycling = Recycling::new();
        let big = Layout::from_size_align(LARGE, 64).unwrap();
        // SAFETY: as above; the blocks are never touched, so they cost address space only.
        unsafe {
            let blocks: Vec<*mut u8> = (0..SLOTS + 1).map(|_| recycling.alloc(big)).collect();
            blocks.iter().for_each(|&b| recycling.dealloc(b, big));
            let cache = recycling.cache.lock().unwrap();
            assert_eq!((cache.len, cache.bytes), (SLOTS, SLOTS * LARGE));
            assert!(cache.bytes <= BUDGET);
            assert!(cache.blocks.iter().all(|&(_, _, at)| at != blocks[0] as usize), "the oldest went back");
        }
    }

    #[test]
    fn a_budget_of_zero_keeps_nothing_and_a_small_one_keeps_what_fits() {
        let recycling = Recycling::new();
        let big = Layout::from_size_align(LARGE, 64).unwrap();
        // SAFETY: as above.
        unsafe {
            recycling.set_budget(0);
            let block = recycling.alloc(big);
            recycling.dealloc(block, big);
            assert_eq!(recycling.cache.lock().unwrap().len, 0);
            recycling.set_budget(2 * LARGE);
            let blocks: Vec<*mut u8> = (0..3).map(|_| recycling.alloc(big)).collect();
            blocks.iter().for_each(|&b| recycling.dealloc(b, big));
            let cache = recycling.cache.lock().unwrap();
            assert_eq!((cache.len, cache.bytes), (2, 2 * LARGE));
        }
    }
}
