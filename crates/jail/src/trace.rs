//! `BRIG_TRACE_SPAWN=1`: where the time of a spawn goes.
//!
//! The host notes its own phases; the sandbox's init notes its steps in a
//! fixed stack array (no allocation) and sends them with its "ready"
//! message. Both use CLOCK_MONOTONIC, so the host prints one timeline.

/// Most steps the init records.
pub const MAX_MARKS: usize = 24;

/// Timestamps of named points, on the stack.
#[derive(Debug, Clone, Copy)]
pub struct Marks {
    on: bool,
    n: usize,
    at: [(u32, u64); MAX_MARKS],
}

/// CLOCK_MONOTONIC in nanoseconds (vDSO; safe in a cloned child).
pub fn now_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

impl Marks {
    pub const fn new(on: bool) -> Self {
        Marks {
            on,
            n: 0,
            at: [(0, 0); MAX_MARKS],
        }
    }

    pub fn hit(&mut self, label: u32) {
        if self.on && self.n < MAX_MARKS {
            self.at[self.n] = (label, now_ns());
            self.n += 1;
        }
    }

    /// Wire form: the marks as (u32 label, u64 ns) pairs, native endian,
    /// written into `buf`; returns the length used.
    pub fn encode(&self, buf: &mut [u8]) -> usize {
        let mut len = 0;
        for &(label, t) in &self.at[..self.n] {
            if len + 12 > buf.len() {
                break;
            }
            buf[len..len + 4].copy_from_slice(&label.to_ne_bytes());
            buf[len + 4..len + 12].copy_from_slice(&t.to_ne_bytes());
            len += 12;
        }
        len
    }

    pub fn decode(buf: &[u8]) -> Vec<(u32, u64)> {
        buf.chunks_exact(12)
            .map(|c| {
                let label = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
                let mut t = [0u8; 8];
                t.copy_from_slice(&c[4..12]);
                (label, u64::from_ne_bytes(t))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_round_trip_and_stay_bounded() {
        let mut m = Marks::new(true);
        for i in 0..(MAX_MARKS as u32 + 5) {
            m.hit(i);
        }
        let mut buf = [0u8; 12 * MAX_MARKS];
        let n = m.encode(&mut buf);
        let back = Marks::decode(&buf[..n]);
        assert_eq!(back.len(), MAX_MARKS);
        assert!(back.windows(2).all(|w| w[0].1 <= w[1].1));
        let mut off = Marks::new(false);
        off.hit(1);
        assert_eq!(off.encode(&mut buf), 0);
    }
}
