//! The decoder's memory is driven by bytes received, never by the lengths a
//! hostile peer declares. A counting allocator records the largest single
//! allocation made by this test's thread while decoding.
//!
//! This file holds one test on purpose: the allocator is process-wide, and
//! the per-thread switch keeps the test harness's own allocations out.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use brig_protocol::{Decoder, Frame, StreamId, HEADER_LEN, MAGIC, MAX_PAYLOAD};

struct Tracking;

thread_local! {
    static ON: Cell<bool> = const { Cell::new(false) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

fn note(size: usize) {
    // try_with: the allocator can run during thread teardown, after the
    // thread-locals are gone; nothing needs recording then.
    let _ = ON.try_with(|on| {
        if on.get() {
            let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
        }
    });
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees carry over; `note` only reads and
// writes const-initialised thread-locals, which never allocate.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` via this allocator with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: `ptr` came from `System` via this allocator with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Largest single allocation made while `f` runs on this thread.
fn largest_allocation(f: impl FnOnce()) -> usize {
    LARGEST.with(|l| l.set(0));
    ON.with(|on| on.set(true));
    f();
    ON.with(|on| on.set(false));
    LARGEST.with(Cell::get)
}

fn header(kind: u8, stream: u32, len: u32) -> Vec<u8> {
    let mut h = vec![MAGIC, kind, 0, 0];
    h.extend_from_slice(&stream.to_le_bytes());
    h.extend_from_slice(&len.to_le_bytes());
    h
}

#[test]
fn decoding_allocates_by_bytes_received_not_lengths_declared() {
    const CHUNK: usize = 4096;
    let junk = vec![0x5a; 64 * CHUNK];

    // A 4 GiB Data frame: refused at the header, nothing reserved for it.
    let mut hostile = header(0x03, 1, u32::MAX);
    hostile.extend_from_slice(&junk);
    let largest = largest_allocation(|| {
        let mut decoder = Decoder::new();
        for chunk in hostile.chunks(CHUNK) {
            decoder.push(chunk);
            while let Ok(Some(_)) = decoder.next_frame() {}
        }
        assert!(decoder.is_failed());
    });
    assert!(
        largest <= CHUNK,
        "a hostile length cost a {largest}-byte allocation"
    );

    // A maximal frame declared but only a quarter sent: memory follows what
    // arrived, not what was promised.
    let mut partial = header(0x03, 1, MAX_PAYLOAD as u32);
    partial.extend_from_slice(&vec![1; MAX_PAYLOAD / 4]);
    let largest = largest_allocation(|| {
        let mut decoder = Decoder::new();
        for chunk in partial.chunks(CHUNK) {
            decoder.push(chunk);
            assert_eq!(decoder.next_frame(), Ok(None));
        }
    });
    assert!(
        largest <= 2 * partial.len(),
        "{largest} bytes allocated for {} received",
        partial.len()
    );

    // A maximal frame trickled in: never more than one frame's worth at once.
    let mut wire = Vec::new();
    Frame::data(StreamId(1), vec![7; MAX_PAYLOAD])
        .encode_into(&mut wire)
        .unwrap();
    let largest = largest_allocation(|| {
        let mut decoder = Decoder::new();
        let mut got = None;
        for chunk in wire.chunks(CHUNK) {
            decoder.push(chunk);
            if let Some(frame) = decoder.next_frame().unwrap() {
                got = Some(frame);
            }
        }
        assert!(got.is_some());
    });
    assert!(
        largest <= HEADER_LEN + MAX_PAYLOAD,
        "{largest}-byte allocation for one maximal frame"
    );
}
