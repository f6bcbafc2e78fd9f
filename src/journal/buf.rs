//! Aligned I/O buffers and their pool.
//!
//! O_DIRECT needs the memory address, the file offset and the length aligned to the block
//! size, so buffers are allocated 4 KiB-aligned. Buffers are allocated once and recycled
//! through [`BufPool`]: the append hot path copies entries into a pooled buffer and never
//! allocates per entry.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ptr::NonNull;

use super::format::BLOCK_BYTES;

/// A heap buffer aligned to [`BLOCK_BYTES`], with a fixed capacity and a fill length.
pub struct IoBuf {
    ptr: NonNull<u8>,
    capacity_bytes: usize,
    len_bytes: usize,
}

// SAFETY: IoBuf owns its allocation exclusively, like Vec<u8>.
unsafe impl Send for IoBuf {}
unsafe impl Sync for IoBuf {}

impl IoBuf {
    /// Allocates a zeroed buffer; `capacity_bytes` must be a non-zero multiple of BLOCK_BYTES.
    pub fn new(capacity_bytes: usize) -> IoBuf {
        assert!(
            capacity_bytes > 0 && capacity_bytes % BLOCK_BYTES == 0,
            "IoBuf capacity {capacity_bytes} must be a positive multiple of {BLOCK_BYTES}"
        );
        let layout = Layout::from_size_align(capacity_bytes, BLOCK_BYTES).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        IoBuf {
            ptr,
            capacity_bytes,
            len_bytes: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity_bytes
    }

    pub fn len(&self) -> usize {
        self.len_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.len_bytes == 0
    }

    pub fn clear(&mut self) {
        self.len_bytes = 0;
    }

    /// The filled part.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: ptr is valid for capacity bytes, len <= capacity, memory initialized (zeroed).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len_bytes) }
    }

    /// The whole capacity, for writing in place.
    pub fn as_full_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above; &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.capacity_bytes) }
    }

    /// Sets the fill length (bytes must already be written through `as_full_mut`).
    pub fn set_len(&mut self, len_bytes: usize) {
        assert!(
            len_bytes <= self.capacity_bytes,
            "set_len {len_bytes} beyond capacity {}",
            self.capacity_bytes
        );
        self.len_bytes = len_bytes;
    }

    /// Zero-fills from the current length to the next block boundary and extends the length,
    /// so the buffer is a whole number of blocks (O_DIRECT) and the padding is not stale data.
    pub fn pad_to_block(&mut self) {
        let padded = self.len_bytes.div_ceil(BLOCK_BYTES) * BLOCK_BYTES;
        let len = self.len_bytes;
        self.as_full_mut()[len..padded].fill(0);
        self.len_bytes = padded;
    }

    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for IoBuf {
    fn drop(&mut self) {
        let layout =
            Layout::from_size_align(self.capacity_bytes, BLOCK_BYTES).expect("valid layout");
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

impl std::fmt::Debug for IoBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "IoBuf(len={}, cap={})",
            self.len_bytes, self.capacity_bytes
        )
    }
}

/// A fixed-size pool of equally sized buffers, allocated up front.
pub struct BufPool {
    free: Vec<IoBuf>,
    buffer_bytes: usize,
    total_buffers: usize,
}

impl BufPool {
    pub fn new(buffers: usize, buffer_bytes: usize) -> BufPool {
        let free = (0..buffers).map(|_| IoBuf::new(buffer_bytes)).collect();
        BufPool {
            free,
            buffer_bytes,
            total_buffers: buffers,
        }
    }

    pub fn free_count(&self) -> usize {
        self.free.len()
    }

    pub fn total(&self) -> usize {
        self.total_buffers
    }

    pub fn buffer_bytes(&self) -> usize {
        self.buffer_bytes
    }

    /// Takes a buffer, empty; None when all are in use.
    pub fn take(&mut self) -> Option<IoBuf> {
        let mut b = self.free.pop()?;
        b.clear();
        Some(b)
    }

    /// Returns a pooled buffer. Buffers of another size (one-off buffers of large entries)
    /// are dropped instead, so the pool never grows.
    pub fn give_back(&mut self, buf: IoBuf) {
        if buf.capacity() == self.buffer_bytes && self.free.len() < self.total_buffers {
            self.free.push(buf);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_padded() {
        let mut b = IoBuf::new(8192);
        assert_eq!(b.as_ptr() as usize % BLOCK_BYTES, 0);
        b.as_full_mut()[..10].fill(7);
        b.as_full_mut()[10..20].fill(9); // junk beyond len must be zeroed by padding
        b.set_len(10);
        b.pad_to_block();
        assert_eq!(b.len(), 4096);
        assert!(b.as_slice()[10..].iter().all(|&x| x == 0));
        assert!(b.as_slice()[..10].iter().all(|&x| x == 7));
    }

    #[test]
    fn pool_recycles() {
        let mut p = BufPool::new(2, 4096);
        let a = p.take().unwrap();
        let b = p.take().unwrap();
        assert!(p.take().is_none());
        p.give_back(a);
        p.give_back(IoBuf::new(8192)); // foreign size: dropped
        assert_eq!(p.free_count(), 1);
        p.give_back(b);
        assert_eq!(p.free_count(), 2);
    }
}
