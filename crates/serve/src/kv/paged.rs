//! The paged store: a pool of fixed pages of p tokens per layer and entry; logical position j of a sequence lives in
//! page ⌊j/p⌋ of its page table at offset j mod p. Pages carry reference counts, so sequences forked from a shared
//! prompt share its pages until one of them writes into a shared page (copy on write).
//!
//! Prefix caching: a pool made [`PagePool::with_prefix_cache`] keeps the full pages of every prompt in an index keyed
//! by the page's tokens and the key of the page before it, so a key stands for the whole prefix up to that page. A
//! later prompt that starts with indexed pages shares them and computes only the rest (vLLM's automatic prefix
//! caching). The index holds a reference on each page it keeps, at most `capacity` logical pages, and lets the least
//! recently used go first.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::rc::Rc;

use burn::tensor::{Int, Tensor, TensorData};
use ember_core_model::cache::{KvCache, attend_appended};
use ember_kernels::{AttentionSpec, decodes_in_place, paged_attention};

/// Hands out page numbers and counts their users.
#[derive(Debug, Default)]
pub struct PageAllocator {
    refs: Vec<u32>,
    free: Vec<usize>,
}

impl PageAllocator {
    /// A free page (a new one when none is free), with one user.
    pub fn allocate(&mut self) -> usize {
        let page = self.free.pop().unwrap_or_else(|| {
            self.refs.push(0);
            self.refs.len() - 1
        });
        self.refs[page] = 1;
        page
    }
    pub fn share(&mut self, page: usize) {
        self.refs[page] += 1;
    }
    pub fn release(&mut self, page: usize) {
        self.refs[page] -= 1;
        if self.refs[page] == 0 {
            self.free.push(page);
        }
    }
    pub fn users(&self, page: usize) -> u32 {
        self.refs[page]
    }
    /// Pages ever created, and pages in use.
    pub fn counts(&self) -> (usize, usize) {
        (self.refs.len(), self.refs.iter().filter(|&&r| r > 0).count())
    }
}

/// The key of the page holding `tokens` after the prefix keyed `parent` (0 before the first page).
fn page_key(parent: u64, tokens: &[u32]) -> u64 {
    let mut hasher = DefaultHasher::new();
    (parent, tokens).hash(&mut hasher);
    hasher.finish()
}

/// One indexed page: its prefix's key and tokens (checked on lookup, so that a hash collision is a miss), its
/// physical page in each layer as the layers write it, and when it was last used.
struct Indexed {
    parent: u64,
    tokens: Vec<u32>,
    pages: Vec<Option<usize>>,
    used: u64,
}

/// Full prompt pages kept for later prompts, at most `capacity`.
struct PrefixIndex {
    capacity: usize,
    entries: HashMap<u64, Indexed>,
    clock: u64,
}

/// Every page's storage: per layer and entry a pool [pages, n, p, w] (once the layer has written), the allocator, and
/// the prefix index when the pool caches prefixes.
pub struct PagePool {
    pub page_size: usize,
    pub allocator: PageAllocator,
    pools: Vec<Option<[Tensor<4>; 2]>>,
    prefixes: Option<PrefixIndex>,
}

impl PagePool {
    pub fn new(page_size: usize) -> Rc<RefCell<Self>> {
        Rc::new(RefCell::new(Self {
            page_size: page_size.max(1),
            allocator: PageAllocator::default(),
            pools: Vec::new(),
            prefixes: None,
        }))
    }

    /// A pool whose sequences share the full pages of earlier prompts, keeping up to `capacity` of them.
    pub fn with_prefix_cache(page_size: usize, capacity: usize) -> Rc<RefCell<Self>> {
        let pool = Self::new(page_size);
        pool.borrow_mut().prefixes = Some(PrefixIndex { capacity, entries: HashMap::new(), clock: 0 });
        pool
    }

    /// Logical pages the prefix index holds.
    pub fn cached_pages(&self) -> usize {
        self.prefixes.as_ref().map_or(0, |index| index.entries.len())
    }

    /// The physical pages, one list per layer, of the longest run of indexed pages that `keys` (a prompt's chain of
    /// page keys, with its pages' tokens) starts with.
    fn lookup(&mut self, keys: &[(u64, u64, &[u32])]) -> Vec<Vec<usize>> {
        let layers = self.pools.len();
        let Some(index) = self.prefixes.as_mut() else { return Vec::new() };
        let mut tables = vec![Vec::new(); layers];
        for &(key, parent, tokens) in keys {
            let Some(entry) = index.entries.get_mut(&key) else { break };
            if entry.parent != parent || entry.tokens != tokens || entry.pages.len() < layers {
                break;
            }
            let Some(pages) = entry.pages.iter().copied().collect::<Option<Vec<usize>>>() else { break };
            index.clock += 1;
            entry.used = index.clock;
            for (table, page) in tables.iter_mut().zip(pages) {
                table.push(page);
                self.allocator.share(page);
            }
        }
        tables
    }

    /// Indexes `page`, layer `layer`'s copy of the prompt page keyed `key`, unless that layer's copy is indexed
    /// already; then evicts the least recently used pages beyond the capacity.
    fn index(&mut self, key: u64, parent: u64, tokens: &[u32], layer: usize, page: usize) {
        let Some(index) = self.prefixes.as_mut() else { return };
        index.clock += 1;
        let entry = index.entries.entry(key).or_insert_with(|| Indexed {
            parent,
            tokens: tokens.to_vec(),
            pages: Vec::new(),
            used: 0,
        });
        if entry.parent != parent || entry.tokens != tokens {
            return;
        }
        entry.used = index.clock;
        if entry.pages.len() <= layer {
            entry.pages.resize(layer + 1, None);
        }
        if entry.pages[layer].is_none() {
            entry.pages[layer] = Some(page);
            self.allocator.share(page);
        }
        while index.entries.len() > index.capacity {
            let Some((&oldest, _)) = index.entries.iter().min_by_key(|(_, e)| e.used) else { break };
            for page in index.entries.remove(&oldest).into_iter().flat_map(|e| e.pages).flatten() {
                self.allocator.release(page);
            }
        }
    }

    /// Layer `layer`'s pools shaped like `entries`, with room for page numbers below `pages` (doubling as needed).
    fn reserve(&mut self, layer: usize, entries: &[Tensor<4>; 2], pages: usize) -> &mut [Tensor<4>; 2] {
        if self.pools.len() <= layer {
            self.pools.resize_with(layer + 1, || None);
        }
        let p = self.page_size;
        let pools = self.pools[layer].get_or_insert_with(|| {
            entries.each_ref().map(|x| {
                let [_, n, _, w] = x.dims();
                Tensor::zeros([pages.max(4), n, p, w], (&x.device(), x.dtype()))
            })
        });
        for pool in pools.iter_mut() {
            let [have, n, _, w] = pool.dims();
            if pages > have {
                let grown = Tensor::zeros([pages.max(2 * have), n, p, w], (&pool.device(), pool.dtype()));
                *pool = grown.slice_assign([0..have, 0..n, 0..p, 0..w], pool.clone());
            }
        }
        pools
    }

    /// Bytes of every pool (f32).
    pub fn bytes(&self) -> usize {
        self.pools.iter().flatten().flatten().map(|t| t.dims().iter().product::<usize>() * t.dtype().size()).sum()
    }

    /// Bytes of one page of `layer`, over its entries.
    fn page_bytes(&self, layer: usize) -> usize {
        let pools = self.pools.get(layer).into_iter().flatten().flatten();
        pools.map(|t| t.dims()[1..].iter().product::<usize>() * t.dtype().size()).sum()
    }
}

/// One sequence: a page table per layer over a shared [`PagePool`].
pub struct PagedCache {
    pool: Rc<RefCell<PagePool>>,
    tables: Vec<Vec<usize>>,
    lens: Vec<usize>,
    /// The key chain of the prompt's full pages and their tokens, which this sequence indexes as it writes them
    /// (empty without prefix caching, and after a context shift).
    prompt: Vec<(u64, u64, Vec<u32>)>,
}

impl PagedCache {
    pub fn new(pool: Rc<RefCell<PagePool>>) -> Self {
        Self { pool, tables: Vec::new(), lens: Vec::new(), prompt: Vec::new() }
    }

    /// A sequence for `prompt` that starts with the indexed pages it shares with earlier prompts (its
    /// [`KvCache::len`] says how many tokens they hold; at least one token is left to compute), and indexes its own
    /// full prompt pages as it writes them.
    pub fn for_prompt(pool: Rc<RefCell<PagePool>>, prompt: &[u32]) -> Self {
        let p = pool.borrow().page_size;
        let mut parent = 0;
        let chain: Vec<(u64, u64, Vec<u32>)> = prompt
            .chunks_exact(p)
            .map(|tokens| {
                let key = page_key(parent, tokens);
                let link = (key, parent, tokens.to_vec());
                parent = key;
                link
            })
            .collect();
        // The last token must run, for its logits: a prompt of whole pages reuses all but its last page.
        let reusable = (prompt.len().saturating_sub(1)) / p;
        let keys: Vec<(u64, u64, &[u32])> = chain[..reusable].iter().map(|(k, q, t)| (*k, *q, t.as_slice())).collect();
        let tables = pool.borrow_mut().lookup(&keys);
        let lens = tables.iter().map(|t| t.len() * p).collect();
        Self { pool, tables, lens, prompt: chain }
    }

    /// A second sequence that continues from this one's tokens, sharing its pages.
    pub fn fork(&self) -> Self {
        let mut pool = self.pool.borrow_mut();
        for &page in self.tables.iter().flatten() {
            pool.allocator.share(page);
        }
        Self { pool: self.pool.clone(), tables: self.tables.clone(), lens: self.lens.clone(), prompt: Vec::new() }
    }

    /// The page table of `layer`: logical page i is physical page `table[i]`.
    pub fn table(&self, layer: usize) -> &[usize] {
        &self.tables[layer]
    }

    /// Slots allocated but not (yet) holding a token, over every layer: fewer than p per layer.
    pub fn waste(&self) -> usize {
        let p = self.pool.borrow().page_size;
        self.tables.iter().zip(&self.lens).map(|(t, &len)| t.len() * p - len).sum()
    }
}

impl Drop for PagedCache {
    fn drop(&mut self) {
        let mut pool = self.pool.borrow_mut();
        for &page in self.tables.iter().flatten() {
            pool.allocator.release(page);
        }
    }
}

impl KvCache for PagedCache {
    fn len(&self) -> usize {
        self.lens.iter().copied().min().unwrap_or(0)
    }

    /// The pages in this sequence's tables (shared pages counted in full).
    fn bytes(&self) -> usize {
        let pool = self.pool.borrow();
        self.tables.iter().enumerate().map(|(layer, table)| table.len() * pool.page_bytes(layer)).sum()
    }

    fn clear(&mut self) {
        let mut pool = self.pool.borrow_mut();
        for &page in self.tables.iter().flatten() {
            pool.allocator.release(page);
        }
        self.tables.clear();
        self.lens.clear();
        // What follows a context shift is no prompt prefix.
        self.prompt.clear();
    }

    /// Keeps the first `len` tokens: the pages past them go back to the pool (a page shared with another sequence
    /// or the prefix index only loses this sequence's reference; a later write into a shared page copies it).
    fn truncate(&mut self, len: usize) -> bool {
        let p = self.pool.borrow().page_size;
        let mut pool = self.pool.borrow_mut();
        for (table, used) in self.tables.iter_mut().zip(&mut self.lens) {
            *used = (*used).min(len);
            table.drain(used.div_ceil(p)..).for_each(|page| pool.allocator.release(page));
        }
        true
    }

    fn append(&mut self, layer: usize, entries: [Tensor<4>; 2]) -> [Tensor<4>; 2] {
        let (end, pools) = self.write(layer, &entries);
        let (p, table) = (self.pool.borrow().page_size, &self.tables[layer]);
        // Gather the sequence's pages in logical order: [k, n, p, w] → [1, n, k·p, w], the first `end` slots.
        pools.map(|buf| {
            let [_, n, _, w] = buf.dims();
            let k = table.len();
            let index = Tensor::<1, Int>::from_data(
                TensorData::new(table.iter().map(|&i| i as i64).collect::<Vec<_>>(), [k]),
                &buf.device(),
            );
            let pages = buf.select(0, index).swap_dims(0, 1).reshape([1, n, k * p, w]);
            pages.slice([0..1, 0..n, 0..end, 0..w])
        })
    }

    /// Decoding on wgpu reads keys and values through the page table with the paged kernel, gathering nothing.
    fn attend(&mut self, layer: usize, q: Tensor<4>, k: Tensor<4>, v: Tensor<4>, spec: &AttentionSpec) -> Tensor<4> {
        if !decodes_in_place(&q, spec) {
            return attend_appended(self, layer, q, k, v, spec);
        }
        let (end, [k_pages, v_pages]) = self.write(layer, &[k, v]);
        paged_attention(q, k_pages, v_pages, vec![self.tables[layer].clone()], end, spec)
    }
}

impl PagedCache {
    /// Writes this step's entries of `layer` into its pages (allocating, or copying shared ones first) and returns the
    /// layer's new length and its pools.
    fn write(&mut self, layer: usize, entries: &[Tensor<4>; 2]) -> (usize, [Tensor<4>; 2]) {
        if self.tables.len() <= layer {
            self.tables.resize_with(layer + 1, Vec::new);
            self.lens.resize(layer + 1, 0);
        }
        let mut pool = self.pool.borrow_mut();
        let p = pool.page_size;
        let [_, _, t, _] = entries[0].dims();
        let (start, end) = (self.lens[layer], self.lens[layer] + t);
        let table = &mut self.tables[layer];
        // Pages for the new positions; a shared page about to be written is copied first (copy on write).
        let first = start / p;
        for logical in first..end.div_ceil(p) {
            if logical == table.len() {
                table.push(pool.allocator.allocate());
            } else if pool.allocator.users(table[logical]) > 1 {
                let (old, new) = (table[logical], pool.allocator.allocate());
                pool.allocator.release(old);
                table[logical] = new;
                let pages = pool.allocator.counts().0;
                for buf in pool.reserve(layer, entries, pages).iter_mut() {
                    let [_, n, _, w] = buf.dims();
                    let copy = buf.clone().slice([old..old + 1, 0..n, 0..p, 0..w]);
                    *buf = buf.clone().slice_assign([new..new + 1, 0..n, 0..p, 0..w], copy);
                }
            }
        }
        let pages = pool.allocator.counts().0;
        pool.reserve(layer, entries, pages);
        // The pools are taken out while written, so that each is the only handle on its buffer and the backend can
        // write in place rather than copy the whole pool for every token.
        let [k_pool, v_pool] = pool.pools[layer].take().expect("reserved above");
        let write_into = |mut buf: Tensor<4>, x: &Tensor<4>| {
            let [_, n, _, w] = x.dims();
            // Write token j of this step into page table[⌊(start + j)/p⌋] at (start + j) mod p, a page-run at a time.
            let mut j = 0;
            while j < t {
                let pos = start + j;
                let (page, off) = (table[pos / p], pos % p);
                let run = (p - off).min(t - j);
                let part = x.clone().slice([0..1, 0..n, j..j + run, 0..w]).reshape([1, n, run, w]);
                buf = buf.slice_assign([page..page + 1, 0..n, off..off + run, 0..w], part);
                j += run;
            }
            buf
        };
        let pools = [write_into(k_pool, &entries[0]), write_into(v_pool, &entries[1])];
        pool.pools[layer] = Some(pools.clone());
        // The prompt's pages this write completed join the prefix index.
        let completed = start / p..end / p;
        for ((key, parent, tokens), &page) in
            self.prompt.iter().zip(table.iter()).skip(completed.start).take(completed.len())
        {
            pool.index(*key, *parent, tokens, layer, page);
        }
        self.lens[layer] = end;
        (end, pools)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A prefix-caching pool of one layer holding at most `capacity` indexed pages.
    fn pool(capacity: usize) -> PagePool {
        let pool = Rc::into_inner(PagePool::with_prefix_cache(2, capacity)).expect("one owner").into_inner();
        PagePool { pools: vec![None], ..pool }
    }

    /// The page a prompt's first page is keyed to, for `tokens`.
    fn first(tokens: &[u32]) -> (u64, u64, &[u32]) {
        (page_key(0, tokens), 0, tokens)
    }

    /// Indexes a fresh page for the first page `tokens`, and hands the sequence's own reference back.
    fn index(pool: &mut PagePool, tokens: &[u32]) -> usize {
        let page = pool.allocator.allocate();
        let (key, parent, tokens) = first(tokens);
        pool.index(key, parent, tokens, 0, page);
        pool.allocator.release(page);
        page
    }

    /// The pages a lookup of the chain `keys` shares, released again.
    fn found(pool: &mut PagePool, keys: &[(u64, u64, &[u32])]) -> Vec<usize> {
        let pages = pool.lookup(keys).pop().unwrap_or_default();
        pages.iter().for_each(|&p| pool.allocator.release(p));
        pages
    }

    #[test]
    fn the_least_recently_used_page_leaves_first_and_its_page_is_freed() {
        let mut pool = pool(2);
        let a = index(&mut pool, &[1, 2]);
        let b = index(&mut pool, &[3, 4]);
        // Using a makes b the oldest: indexing c evicts b.
        assert_eq!(found(&mut pool, &[first(&[1, 2])]), [a]);
        let c = index(&mut pool, &[5, 6]);
        assert_eq!(pool.cached_pages(), 2);
        assert_eq!(found(&mut pool, &[first(&[3, 4])]), Vec::<usize>::new());
        assert_eq!(pool.allocator.users(b), 0, "an evicted page keeps no user");
        assert_eq!((pool.allocator.users(a), pool.allocator.users(c)), (1, 1), "the index holds one reference each");
        assert_eq!(found(&mut pool, &[first(&[5, 6])]), [c]);
        // b's page is free again: the next allocation takes it.
        assert_eq!(pool.allocator.allocate(), b);
    }

    #[test]
    fn a_lookup_follows_the_chain_and_stops_at_the_first_miss() {
        let mut pool = pool(8);
        let (one, two, three) = ([1, 2], [3, 4], [5, 6]);
        let (k1, k2) = (page_key(0, &one), page_key(page_key(0, &one), &two));
        let p1 = index(&mut pool, &one);
        let p2 = pool.allocator.allocate();
        pool.index(k2, k1, &two, 0, p2);
        let chain = [(k1, 0, &one[..]), (k2, k1, &two[..]), (page_key(k2, &three), k2, &three[..])];
        assert_eq!(found(&mut pool, &chain), [p1, p2]);
        // The same tokens after another prefix are another key: a miss from the second page on.
        let other = [(k1, 0, &one[..]), (page_key(99, &two), 99, &two[..])];
        assert_eq!(found(&mut pool, &other), [p1]);
    }

    #[test]
    fn a_key_whose_tokens_differ_is_a_miss() {
        let mut pool = pool(4);
        let page = index(&mut pool, &[1, 2]);
        // A collision: the same key with other tokens neither matches nor replaces the entry.
        let (key, _, _) = first(&[1, 2]);
        assert_eq!(found(&mut pool, &[(key, 0, &[7, 8])]), Vec::<usize>::new());
        pool.index(key, 0, &[7, 8], 0, pool.allocator.counts().0);
        assert_eq!(found(&mut pool, &[first(&[1, 2])]), [page]);
        assert_eq!(pool.cached_pages(), 1);
    }

    #[test]
    fn a_capacity_of_zero_keeps_nothing() {
        let mut pool = pool(0);
        let page = index(&mut pool, &[1, 2]);
        assert_eq!(pool.cached_pages(), 0);
        assert_eq!(pool.allocator.users(page), 0);
        assert_eq!(found(&mut pool, &[first(&[1, 2])]), Vec::<usize>::new());
    }
}
