//! A small deterministic mutator for the in-process smoke fuzzer (no external tools):
//! bit flips, byte sets, interesting integers, inserts, deletes, duplications and splices.

/// xorshift64* pseudo-random numbers.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next_u64() % n as u64) as usize
        }
    }
}

const INTERESTING: &[u32] = &[
    0,
    1,
    4,
    7,
    8,
    0x7f,
    0x80,
    0xff,
    0x100,
    0x7fff,
    0x8000,
    0xffff,
    0x10000,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
];

/// Mutates `v` in place 1..=8 times; `other` is a second input to splice from.
pub fn mutate(v: &mut Vec<u8>, other: &[u8], rng: &mut Rng, max_len: usize) {
    let rounds = 1 + rng.below(8);
    for _ in 0..rounds {
        match rng.below(10) {
            0 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] ^= 1 << rng.below(8);
            }
            1 if !v.is_empty() => {
                let i = rng.below(v.len());
                v[i] = rng.next_u64() as u8;
            }
            2 if v.len() >= 4 => {
                let i = rng.below(v.len() - 3);
                let x = INTERESTING[rng.below(INTERESTING.len())];
                let b = if rng.below(2) == 0 {
                    x.to_be_bytes()
                } else {
                    x.to_le_bytes()
                };
                v[i..i + 4].copy_from_slice(&b);
            }
            3 if !v.is_empty() => {
                let i = rng.below(v.len());
                let x = INTERESTING[rng.below(INTERESTING.len())] as u8;
                v[i] = x;
            }
            4 => {
                let i = rng.below(v.len() + 1);
                let n = 1 + rng.below(16);
                for _ in 0..n {
                    v.insert(i, rng.next_u64() as u8);
                }
            }
            5 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = 1 + rng.below((v.len() - i).min(32));
                v.drain(i..i + n);
            }
            6 if !v.is_empty() => {
                let i = rng.below(v.len());
                let n = 1 + rng.below((v.len() - i).min(64));
                let dup = v[i..i + n].to_vec();
                let at = rng.below(v.len() + 1);
                v.splice(at..at, dup);
            }
            7 if !other.is_empty() => {
                let i = rng.below(v.len() + 1);
                let j = rng.below(other.len());
                let n = 1 + rng.below(other.len() - j);
                v.truncate(i);
                v.extend_from_slice(&other[j..j + n]);
            }
            8 if !v.is_empty() => {
                let i = rng.below(v.len());
                v.truncate(i);
            }
            _ => {
                let i = rng.below(v.len() + 1);
                v.insert(i, b"\n \r0123456789{}\":,-"[rng.below(19)]);
            }
        }
    }
    v.truncate(max_len);
}
