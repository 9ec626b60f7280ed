//! The module's heap is Redis's: every Rust allocation goes through
//! `RM_Alloc`, `RM_Realloc` and `RM_Free`, so `used_memory`, `maxmemory` and
//! active defragmentation see it. Unlike `redis_module::alloc::RedisAlloc`,
//! a growing block is reallocated in place when the allocator can (a shared
//! lock gaining a reader, a semaphore a permit), not copied every time.

use std::alloc::{GlobalAlloc, Layout};

use redis_module::raw;

pub struct RedisHeap;

/// Before `RedisModule_Init` there is no heap: nothing may allocate then.
fn no_heap() -> ! {
    use std::io::Write;
    // Nothing that allocates: no panic message, no formatting (stderr is
    // unbuffered).
    let _ = std::io::stderr().write_all(b"lock: the Redis allocator is not available\n");
    std::process::abort()
}

/// Sizes rounded up to the alignment: Redis's jemalloc aligns a block to
/// the largest power of two its size class is a multiple of.
fn size(layout: &Layout, size: usize) -> usize {
    let align = layout.align();
    size.saturating_add(align - 1) & !(align - 1)
}

// SAFETY: every block comes from Redis's allocator with at least the size
// asked (rounded to its alignment, which its size classes then give), and
// goes back to it.
unsafe impl GlobalAlloc for RedisHeap {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the entry was filled by RedisModule_Init.
        match unsafe { raw::RedisModule_Alloc } {
            // SAFETY: a size; Redis returns a block or aborts (out of memory).
            Some(alloc) => unsafe { alloc(size(&layout, layout.size())) }.cast(),
            None => no_heap(),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: as above.
        match unsafe { raw::RedisModule_Free } {
            // SAFETY: a block this allocator returned.
            Some(free) => unsafe { free(ptr.cast()) },
            None => no_heap(),
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        match unsafe { raw::RedisModule_Realloc } {
            // SAFETY: a block this allocator returned, and its new size.
            Some(realloc) => unsafe { realloc(ptr.cast(), size(&layout, new_size)) }.cast(),
            None => no_heap(),
        }
    }
}

/// The thread large freed memory goes to ([`free_elsewhere`]), started on
/// first use: its end of the channel.
static FREER: std::sync::Mutex<Option<std::sync::mpsc::Sender<lock_core::Garbage>>> =
    std::sync::Mutex::new(None);

/// Frees a block's large memory let go of (a purge's last slice at a
/// million holders: tens of megabytes, milliseconds of `munmap`) on a
/// thread of the module's own, as Redis frees a large value in the
/// background (lazyfree): the event loop does not wait for it. Redis's
/// allocator is thread-safe; `used_memory` drops when the thread is done.
/// Without the thread (it could not be started) it is freed here.
pub fn free_elsewhere(garbage: lock_core::Garbage) {
    let mut freer = FREER.lock().unwrap_or_else(|p| p.into_inner());
    if freer.is_none() {
        let (tx, rx) = std::sync::mpsc::channel::<lock_core::Garbage>();
        let started = std::thread::Builder::new()
            .name("lock-free".into())
            .spawn(move || rx.into_iter().for_each(drop));
        if started.is_ok() {
            *freer = Some(tx);
        }
    }
    let left = match freer.as_ref() {
        Some(tx) => tx.send(garbage).err().map(|e| e.0),
        None => Some(garbage),
    };
    drop(freer);
    // (No thread: freed here, after the lock is let go.)
    drop(left);
}
