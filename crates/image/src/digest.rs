//! Digests: checking the `sha256:<hex>` strings that name blobs and layers,
//! and hashing a stream while it is read.
//!
//! A digest becomes a file name in the store (`blobs/sha256/<hex>`,
//! `layers/<hex>`), so every digest that comes from outside (a manifest, a
//! caller) is checked here first: exactly 64 lowercase hex digits, which
//! cannot name anything but one entry of one directory.

use std::io::{self, Read};

use sha2::{Digest as _, Sha256};

use crate::ImageError;

/// The only algorithm brig stores (every registry and tool uses it).
pub const SHA256: &str = "sha256";

/// The hex part of `sha256:<hex>`, if `digest` is a valid sha256 digest.
pub fn hex_of(digest: &str) -> Option<&str> {
    let hex = digest.strip_prefix("sha256:")?;
    let valid = hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    valid.then_some(hex)
}

/// [`hex_of`], or [`ImageError::InvalidDigest`].
pub fn check(digest: &str) -> Result<&str, ImageError> {
    hex_of(digest).ok_or_else(|| ImageError::InvalidDigest {
        digest: digest.to_string(),
    })
}

/// `sha256:<hex>` of `bytes`.
pub fn of_bytes(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A reader that hashes and counts what passes through it.
pub(crate) struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    count: u64,
}

impl<R: Read> HashingReader<R> {
    pub(crate) fn new(inner: R) -> Self {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            count: 0,
        }
    }

    /// Read what is left (a tar's padding after its end marker counts
    /// towards the digest too), then the digest and the byte count.
    pub(crate) fn finish(mut self) -> io::Result<(String, u64)> {
        io::copy(&mut self, &mut io::sink())?;
        Ok((
            format!("sha256:{}", hex::encode(self.hasher.finalize())),
            self.count,
        ))
    }
}

impl<R: Read> Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.count += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_sha256_with_64_lowercase_hex_digits_is_a_digest() {
        let good = of_bytes(b"x");
        assert_eq!(hex_of(&good).map(str::len), Some(64));
        for bad in [
            "",
            "sha256:",
            "sha512:0000",
            &good.to_uppercase(),
            &good.replace("sha256:", "sha256:../"),
            &format!("{good}0"),
            &good[..good.len() - 1],
            &good.replace("sha256:", ""),
        ] {
            assert!(hex_of(bad).is_none(), "{bad:?} passed");
            assert!(matches!(check(bad), Err(ImageError::InvalidDigest { .. })));
        }
    }

    #[test]
    fn the_hashing_reader_hashes_what_is_left_too() {
        let mut r = HashingReader::new(&b"hello world"[..]);
        let mut first = [0u8; 5];
        r.read_exact(&mut first).unwrap();
        let (digest, n) = r.finish().unwrap();
        assert_eq!(digest, of_bytes(b"hello world"));
        assert_eq!(n, 11);
    }
}
