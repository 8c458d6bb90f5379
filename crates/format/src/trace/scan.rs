//! The trace-event scanner: one Kineto/Chrome trace event read from its bytes in one pass,
//! without building a value tree.
//!
//! [`Event`] reads the fields analysis needs (`ph`, `cat`, `name`, `pid`, `tid`, `ts`, `dur`),
//! borrowing each string from the buffer where it holds no escape, keeps where `args` stands
//! (read on demand by [`Event::args`]: the correlation id, the device, `Record function id`
//! and `requests`), and skips every other value by its structure: a string to its closing
//! quote (sixteen bytes at a time, noting whether all were ASCII, which then need no UTF-8
//! check), an array or object to its matching bracket (64 bytes at a time as bit masks, the
//! strings among them found by the parity of their quotes, simdjson's way; AVX2 where the CPU
//! has it, else SSE2, part of every x86_64, else the same masks byte by byte). What it reads is
//! checked as serde checked it (a `ts` that is a string is an error naming the byte; `args` it
//! cannot read are taken as absent, as before). An event's members in the order and spacing
//! Kineto writes them (`, "cat": ` after `ph`'s value, …) are each found by one 16-byte
//! compare; any other is read as JSON. The event's own members are checked against
//! JSON's grammar; the values it skips, `args` included, for structure — strings end, brackets
//! match, a scalar is a number or a literal — not for every rule of the grammar (a missing
//! comma inside a skipped array is not reported).
//!
//! Numbers are read as JSON defines them and rounded correctly: a mantissa under 2^53 with up
//! to 22 decimals (every timestamp Kineto writes in µs) is exact in one division; a longer one
//! with a fraction, such as a nanosecond trace's `1712195495505582.988`, is its whole part
//! plus its fraction ([`whole_plus_fraction`]); others go to the standard library's parser.
//!
//! Kept whole although it is long: it is one job, the scanner, whose parts (the types a sink
//! takes an event as, the byte-level search, the number reader and the [`Scanner`] that walks
//! an event with them) make one hot path, read together.

use std::borrow::Cow;

use serde::de::{Deserialize, IgnoredAny};

use super::event::{args_read, Args, ArgsAt, Event, Id, RawArgs, ARGS_KEYS};

/// What an [`EventSink`](super::EventSink) takes each event as: [`Event`] (the fields
/// analysis reads), [`RawEvent`] (the event's JSON text), [`Skip`] (nothing), [`IgnoredAny`],
/// or [`Serde<T>`] for any type serde deserializes (the event's bytes are found by the scanner,
/// then handed to serde_json).
pub trait FromTrace<'de>: Sized + sealed::Sealed {
    #[doc(hidden)]
    fn scan(s: &mut Scanner<'de>) -> Result<Self, Fault>;
}

mod sealed {
    pub trait Sealed {}
    impl Sealed for super::Event<'_> {}
    impl Sealed for super::RawEvent<'_> {}
    impl Sealed for super::Skip {}
    impl Sealed for super::IgnoredAny {}
    impl<T> Sealed for super::Serde<T> {}
}

/// An event's JSON text, checked for structure (see the module docs), borrowed from the
/// reader's buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawEvent<'a> {
    text: &'a str,
}

impl<'a> RawEvent<'a> {
    /// The event's JSON, from its first byte to its last.
    pub fn text(&self) -> &'a str {
        self.text
    }
}

/// An event skipped: only its structure is checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skip;

/// An event deserialized by serde_json into `T`, from the bytes the scanner found for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Serde<T>(pub T);

/// Why an event could not be read. One word: every scanning call returns it, so its size
/// is paid on the hot path.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fault {
    /// The bytes end inside the event: more are needed (or the document is cut short).
    Cut,
    /// Not what a trace event may hold.
    Bad(Box<Bad>),
}

/// What is wrong, at which offset into the event's bytes.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bad {
    /// The offset of the byte at fault, from the event's first byte.
    pub at: usize,
    /// What is wrong.
    pub message: String,
}

type Scan<T> = Result<T, Fault>;

/// Reads one event from the front of a buffer.
#[doc(hidden)]
pub struct Scanner<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// Nesting a skipped value may have (serde_json's limit too).
const MAX_DEPTH: u32 = 128;

/// Powers of ten a double holds exactly.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// The powers of ten a u64 holds.
const POW10_U64: [u64; 20] = {
    let mut p = [1u64; 20];
    let mut i = 1;
    while i < p.len() {
        p[i] = p[i - 1] * 10;
        i += 1;
    }
    p
};

/// Eight bytes at a time (SWAR): a word's bytes, first byte lowest.
const ONES: u64 = 0x0101_0101_0101_0101;
const HIGHS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each zero byte of `x`. Bytes above the first zero byte may be flagged
/// wrongly (a borrow): only the lowest flag is used.
#[inline(always)]
fn zeros(x: u64) -> u64 {
    x.wrapping_sub(ONES) & !x & HIGHS
}

/// The word of 8 bytes at `at` (which must be in bounds).
#[inline(always)]
fn word(b: &[u8], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

/// The first quote or backslash at or after `at`: sixteen bytes at a time, then eight.
/// Clears `ascii` when a byte before it, from `at` on, is not ASCII.
#[inline(always)]
fn find_quote_or_backslash(b: &[u8], mut at: usize, ascii: &mut bool) -> Option<usize> {
    while let Some(chunk) = b.get(at..at + 16) {
        let (m, high) = quotes_or_backslashes(chunk);
        if m != 0 {
            let i = m.trailing_zeros();
            *ascii &= high & ((1 << i) - 1) == 0;
            return Some(at + i as usize);
        }
        *ascii &= high == 0;
        at += 16;
    }
    while at + 8 <= b.len() {
        let w = word(b, at);
        let m = zeros(w ^ (ONES * u64::from(b'"'))) | zeros(w ^ (ONES * u64::from(b'\\')));
        if m != 0 {
            let i = m.trailing_zeros();
            // The high bits of the bytes before the match (bit 8k+7 for byte k).
            *ascii &= w & HIGHS & ((1 << i) - 1) == 0;
            return Some(at + (i / 8) as usize);
        }
        *ascii &= w & HIGHS == 0;
        at += 8;
    }
    for (i, &c) in b.get(at..)?.iter().enumerate() {
        if c == b'"' || c == b'\\' {
            return Some(at + i);
        }
        *ascii &= c.is_ascii();
    }
    None
}

/// Bit `i` set where byte `i` of 16 is a quote or a backslash; and where it is not ASCII.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn quotes_or_backslashes(chunk: &[u8]) -> (u32, u32) {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    debug_assert!(chunk.len() >= 16);
    // SAFETY: SSE2 is part of every x86_64; the 16 bytes loaded (unaligned) are `chunk`'s.
    let (m, high) = unsafe {
        let v = _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>());
        let m = _mm_movemask_epi8(_mm_or_si128(
            _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8)),
            _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8)),
        ));
        (m, _mm_movemask_epi8(v))
    };
    (m as u32 & 0xFFFF, high as u32 & 0xFFFF)
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn quotes_or_backslashes(chunk: &[u8]) -> (u32, u32) {
    chunk[..16]
        .iter()
        .enumerate()
        .fold((0, 0), |(m, high), (i, &c)| {
            (
                m | u32::from(c == b'"' || c == b'\\') << i,
                high | u32::from(!c.is_ascii()) << i,
            )
        })
}

/// Where the array or object opened at `at` ends (after its closing bracket), when that
/// bracket is among the 15 bytes after the opening one with no bracket, quote or backslash
/// before it: a flat value such as a kernel's `"grid": [2400, 1, 1]`, told by one 16-byte
/// compare instead of [`Scanner::skip_nested`]'s 64-byte masks. `None` for any other.
#[inline(always)]
fn flat_end(b: &[u8], at: usize) -> Option<usize> {
    let bytes = b.get(at..at + 16)?;
    // Bit `i` for byte `i` that is a bracket, a quote or a backslash: the opening one is bit 0.
    let marks = structural_marks(bytes) & !1;
    if marks == 0 {
        return None;
    }
    let j = marks.trailing_zeros() as usize;
    (bytes[j] == bytes[0] + 2).then_some(at + j + 1)
}

/// Bit `i` set where byte `i` of 16 is one of `[]{}"\`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn structural_marks(chunk: &[u8]) -> u32 {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    debug_assert!(chunk.len() >= 16);
    // SAFETY: SSE2 is part of every x86_64; the 16 bytes loaded (unaligned) are `chunk`'s.
    let m = unsafe {
        let v = _mm_loadu_si128(chunk.as_ptr().cast::<__m128i>());
        let folded = _mm_or_si128(v, _mm_set1_epi8(0x20));
        _mm_movemask_epi8(_mm_or_si128(
            _mm_or_si128(
                _mm_cmpeq_epi8(folded, _mm_set1_epi8(b'{' as i8)),
                _mm_cmpeq_epi8(folded, _mm_set1_epi8(b'}' as i8)),
            ),
            _mm_or_si128(
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8)),
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8)),
            ),
        ))
    };
    m as u32 & 0xFFFF
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn structural_marks(chunk: &[u8]) -> u32 {
    chunk[..16].iter().enumerate().fold(0, |m, (i, &c)| {
        m | u32::from(matches!(c, b'[' | b']' | b'{' | b'}' | b'"' | b'\\')) << i
    })
}

/// One block of 64 bytes as bit masks, bit `i` for byte `i`.
#[derive(Debug, Default, PartialEq, Eq)]
struct Block {
    quotes: u64,
    backslashes: u64,
    /// `{` and `[`.
    opens: u64,
    /// `}` and `]`.
    closes: u64,
}

impl Block {
    /// Adds the masks of the bytes from `at` on: quotes, backslashes, opens, closes.
    #[inline(always)]
    fn put(&mut self, at: usize, [quotes, backslashes, opens, closes]: [u64; 4]) {
        self.quotes |= quotes << at;
        self.backslashes |= backslashes << at;
        self.opens |= opens << at;
        self.closes |= closes << at;
    }
}

/// The masks of the 64 bytes at `b`. `[` and `]` differ from `{` and `}` by the bit 0x20
/// alone, and no other byte becomes `{` or `}` when that bit is set: one compare each.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn block(b: &[u8; 64]) -> Block {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    let mut m = Block::default();
    for k in 0..4 {
        // SAFETY: SSE2 is part of every x86_64; the 16 bytes loaded (unaligned) are within
        // `b`'s 64.
        let (q, s, o, c) = unsafe {
            let v = _mm_loadu_si128(b.as_ptr().add(16 * k).cast::<__m128i>());
            let folded = _mm_or_si128(v, _mm_set1_epi8(0x20));
            (
                _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8))),
                _mm_movemask_epi8(_mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8))),
                _mm_movemask_epi8(_mm_cmpeq_epi8(folded, _mm_set1_epi8(b'{' as i8))),
                _mm_movemask_epi8(_mm_cmpeq_epi8(folded, _mm_set1_epi8(b'}' as i8))),
            )
        };
        m.put(
            16 * k,
            [q as u16, s as u16, o as u16, c as u16].map(u64::from),
        );
    }
    m
}

/// [`block`] by AVX2, where the CPU has it: 32 bytes a compare, half the instructions.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn block_avx2(b: &[u8; 64]) -> Block {
    use std::arch::x86_64::{
        __m256i, _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_movemask_epi8, _mm256_or_si256,
        _mm256_set1_epi8,
    };
    let mut m = Block::default();
    for k in 0..2 {
        // SAFETY: the 32 bytes loaded (unaligned) are within `b`'s 64; AVX2 is enabled here.
        let (q, s, o, c) = unsafe {
            let v = _mm256_loadu_si256(b.as_ptr().add(32 * k).cast::<__m256i>());
            let folded = _mm256_or_si256(v, _mm256_set1_epi8(0x20));
            (
                _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'"' as i8))),
                _mm256_movemask_epi8(_mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\\' as i8))),
                _mm256_movemask_epi8(_mm256_cmpeq_epi8(folded, _mm256_set1_epi8(b'{' as i8))),
                _mm256_movemask_epi8(_mm256_cmpeq_epi8(folded, _mm256_set1_epi8(b'}' as i8))),
            )
        };
        m.put(
            32 * k,
            [q as u32, s as u32, o as u32, c as u32].map(u64::from),
        );
    }
    m
}

#[cfg(not(target_arch = "x86_64"))]
#[inline(always)]
fn block(b: &[u8; 64]) -> Block {
    let mut m = Block::default();
    for (i, &c) in b.iter().enumerate() {
        let bit = 1u64 << i;
        match c {
            b'"' => m.quotes |= bit,
            b'\\' => m.backslashes |= bit,
            _ => match c | 0x20 {
                b'{' => m.opens |= bit,
                b'}' => m.closes |= bit,
                _ => {}
            },
        }
    }
    m
}

/// Bit `i` of the result is the parity of bits `0..=i` of `x`: over the quotes of a block
/// without escapes, the bytes from an opening quote up to (not including) its closing one.
#[inline(always)]
fn prefix_xor(mut x: u64) -> u64 {
    x ^= x << 1;
    x ^= x << 2;
    x ^= x << 4;
    x ^= x << 8;
    x ^= x << 16;
    x ^= x << 32;
    x
}

/// JSON's whitespace.
#[inline(always)]
fn blank(c: u8) -> bool {
    matches!(c, b' ' | b'\n' | b'\r' | b'\t')
}

impl ArgsAt {
    /// The string opened at `j`, at the object's own level, of an object at `start`: where it
    /// is one of [`ARGS_KEYS`] (those bytes, its closing quote, then a `:`), its value's offset.
    #[inline(always)]
    fn key(&mut self, b: &[u8], j: usize, start: usize) {
        let f = match b.get(j + 1) {
            Some(b'c') => 0,
            Some(b'd') => 1,
            Some(b'R') => 2,
            Some(b'r') => 3,
            Some(b's') => 4,
            _ => return,
        };
        let end = j + 1 + ARGS_KEYS[f].len();
        if b.get(j + 1..end) != Some(ARGS_KEYS[f]) || b.get(end) != Some(&b'"') {
            return;
        }
        let mut v = end + 1;
        while b.get(v).is_some_and(|&c| blank(c)) {
            v += 1;
        }
        // A string that no `:` follows, or that a `:` precedes, is a value.
        let mut p = j;
        while p > start && blank(b[p - 1]) {
            p -= 1;
        }
        if b.get(v) != Some(&b':') || !matches!(b[p - 1], b'{' | b',') {
            return;
        }
        let Ok(at) = u32::try_from(v + 1 - start) else {
            self.known = false;
            return;
        };
        if self.at[f] == 0 {
            self.at[f] = at;
        } else {
            self.twice = true;
        }
    }
}

/// Where a skipped array or object's walk stands.
#[derive(Default)]
struct Walk {
    /// The open brackets, innermost in the lowest bit (1: an object).
    open: u128,
    depth: u32,
    /// Inside a string.
    in_string: bool,
    /// The byte before was a backslash inside a string.
    escaped: bool,
}

/// `parts`, one after another, as the low bytes of a little-endian word, and their count: the
/// text a key compare of the scanner looks for (at most 16 bytes, checked when compiled).
const fn packed(parts: &[&[u8]]) -> (u128, usize) {
    let (mut w, mut n) = (0u128, 0usize);
    let mut p = 0;
    while p < parts.len() {
        let mut i = 0;
        while i < parts[p].len() {
            assert!(n < 16, "more than 16 bytes");
            w |= (parts[p][i] as u128) << (8 * n);
            n += 1;
            i += 1;
        }
        p += 1;
    }
    (w, n)
}

/// Reads the digits at `*i` into `m` (wrapping: the caller counts them), returns how many.
/// (Eight at a time by SWAR measured no faster on Kineto's timestamps: most numbers are short.)
#[inline(always)]
fn take_digits(b: &[u8], i: &mut usize, m: &mut u64) -> u32 {
    let mut n = 0;
    while let Some(&d) = b.get(*i) {
        let v = d.wrapping_sub(b'0');
        if v > 9 {
            break;
        }
        *m = m.wrapping_mul(10).wrapping_add(u64::from(v));
        n += 1;
        *i += 1;
    }
    n
}

/// A byte as error messages show it.
fn show(b: u8) -> String {
    if b.is_ascii() {
        format!("{:?}", char::from(b))
    } else {
        format!("byte 0x{b:02x}")
    }
}

/// `m / 10^decimals` correctly rounded, as the whole part plus the fraction, where that sum
/// is exact to the bit: a time in µs since the epoch with a fraction (`1712195495505582.988`,
/// whose 19 digits overflow the one-division path) would otherwise go through the standard
/// parser, 7% of the CPU of reading a nanosecond trace (`perf`, HTA's `ns_resolution` trace).
///
/// Why the sum is the correctly rounded value: the whole part `w` (below 2^53) is exact; the
/// fraction `k / 10^d` (`k`, `10^d` exact) is one correctly rounded division, off by at most
/// 2^-54. `w + f` is rounded once, so it differs from the exact value's rounding only if a
/// rounding boundary (a midpoint between neighbouring doubles) lies within 2^-54 of the exact
/// value. With `w` at least 2^40 those midpoints are multiples of 2^-13; the exact fraction is
/// either one of them (a dyadic fraction of 13 bits or fewer: exact as a double, no error) or at
/// least `1 / (2^13 · 10^d)` from each, over 2^-54 for `d` up to 12. Outside those bounds,
/// `None` (the standard parser). (A mantissa reaches here only with up to 19 digits, so with
/// a whole of 13 digits or more `d` is at most 6: the bound on `d` never binds today.)
fn whole_plus_fraction(m: u64, decimals: u32) -> Option<f64> {
    if !(1..=12).contains(&decimals) {
        return None;
    }
    let p = POW10_U64[decimals as usize];
    let whole = m / p;
    if !((1 << 40)..(1 << 53)).contains(&whole) {
        return None;
    }
    Some(whole as f64 + (m % p) as f64 / p as f64)
}

/// A time as a double and split at its point ([`Number::split`]).
type Time = (Option<f64>, Option<(i64, f64)>);

/// A number's text, checked against JSON's grammar, with what a fast conversion needs.
struct Number<'a> {
    text: &'a [u8],
    negative: bool,
    /// The digits without the point, when they fit (`None`: more than 19 digits' worth).
    mantissa: Option<u64>,
    /// Digits after the point.
    decimals: u32,
    /// Has a point or an exponent.
    float: bool,
    /// Has an exponent.
    exponent: bool,
}

impl Number<'_> {
    fn f64(&self) -> f64 {
        if let (Some(m), false) = (self.mantissa, self.exponent) {
            if m < (1 << 53) && (self.decimals as usize) < POW10.len() {
                // Both exact: one correctly rounded division.
                let v = m as f64 / POW10[self.decimals as usize];
                return if self.negative { -v } else { v };
            }
            if let Some(v) = whole_plus_fraction(m, self.decimals) {
                return if self.negative { -v } else { v };
            }
        }
        // The grammar was checked: the standard parser takes every JSON number.
        std::str::from_utf8(self.text)
            .ok()
            .and_then(|t| t.parse().ok())
            .unwrap_or(f64::NAN)
    }

    /// Whole and fractional parts, exactly as written (`None` with an exponent, or more
    /// digits than fit).
    fn split(&self) -> Option<(i64, f64)> {
        let m = self.mantissa.filter(|_| !self.exponent)?;
        let (whole, frac) = if self.decimals == 0 {
            (m, 0.0)
        } else {
            let p = *POW10_U64.get(self.decimals as usize)?;
            (m / p, (m % p) as f64 / p as f64)
        };
        let whole = i64::try_from(whole).ok()?;
        Some(if self.negative {
            (-whole, -frac)
        } else {
            (whole, frac)
        })
    }

    /// As serde_json hands an integer to a visitor: `u64` for non-negative, `i64` for negative
    /// ones that fit, else a double.
    fn i64(&self) -> i64 {
        match (self.float, self.mantissa) {
            (false, Some(m)) if !self.negative => m as i64,
            (false, Some(m)) if m <= 1 << 63 => (m as i128).wrapping_neg() as i64,
            _ => self.f64() as i64,
        }
    }

    /// A non-negative integer that fits, as serde reads a `u64`.
    fn u64(&self) -> Option<u64> {
        match (self.float, self.negative) {
            (false, false) => self.mantissa,
            _ => None,
        }
    }
}

impl<'a> Scanner<'a> {
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Scanner { buf, pos: 0 }
    }

    /// Bytes read.
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }

    #[cold]
    #[inline(never)]
    fn bad<T>(&self, at: usize, message: impl Into<String>) -> Scan<T> {
        Err(Fault::Bad(Box::new(Bad {
            at,
            message: message.into(),
        })))
    }

    /// The next byte that is not whitespace, not consumed.
    #[inline(always)]
    fn next(&mut self) -> Scan<u8> {
        // Every byte JSON's whitespace is made of is at most b' ', every other a value or a
        // separator may start with is above it: one compare for the byte most calls meet.
        if let Some(&b) = self.buf.get(self.pos) {
            if b > b' ' {
                return Ok(b);
            }
            // One space, as after each `,` and `:` of Kineto's JSON: one more compare.
            if b == b' ' {
                if let Some(&c) = self.buf.get(self.pos + 1) {
                    if c > b' ' {
                        self.pos += 1;
                        return Ok(c);
                    }
                }
            }
        }
        while let Some(&b) = self.buf.get(self.pos) {
            if !blank(b) {
                return Ok(b);
            }
            self.pos += 1;
        }
        Err(Fault::Cut)
    }

    /// Consumes `b`, after whitespace.
    #[inline(always)]
    fn eat(&mut self, b: u8, what: &str) -> Scan<()> {
        let got = self.next()?;
        if got == b {
            self.pos += 1;
            Ok(())
        } else {
            self.bad(self.pos, format!("expected {what}, found {}", show(got)))
        }
    }

    /// After a member or an element: `true` at `,` (consumed), `false` at `close` (consumed).
    #[inline(always)]
    fn more(&mut self, close: u8) -> Scan<bool> {
        match self.next()? {
            b',' => {
                self.pos += 1;
                Ok(true)
            }
            b if b == close => {
                self.pos += 1;
                Ok(false)
            }
            b => self.bad(
                self.pos,
                format!("expected ',' or {}, found {}", show(close), show(b)),
            ),
        }
    }

    /// The bytes between the quotes of the string at `pos`, whether they hold an escape, and
    /// whether they are all ASCII (`false` may also mean not known).
    #[inline(always)]
    fn raw_string(&mut self) -> Scan<(&'a [u8], bool, bool)> {
        let start = self.pos + 1;
        let mut at = start;
        let mut escaped = false;
        let mut ascii = true;
        loop {
            let Some(j) = find_quote_or_backslash(self.buf, at, &mut ascii) else {
                return Err(Fault::Cut);
            };
            if self.buf[j] == b'"' {
                self.pos = j + 1;
                return Ok((&self.buf[start..j], escaped, ascii));
            }
            // A backslash: the byte after it is taken as it is (an escaped quote or
            // backslash does not end the string).
            escaped = true;
            at = j + 2;
        }
    }

    /// The string at `pos` (after whitespace), unescaped.
    #[inline(always)]
    fn string(&mut self) -> Scan<Cow<'a, str>> {
        let at = self.pos;
        let (raw, escaped, ascii) = self.raw_string()?;
        if escaped {
            return match unescape(raw) {
                Ok(s) => Ok(Cow::Owned(s)),
                Err(message) => self.bad(at, message),
            };
        }
        if ascii {
            // SAFETY: every byte of `raw` was found below 0x80 as it was searched for its
            // closing quote; ASCII is UTF-8.
            return Ok(Cow::Borrowed(unsafe { std::str::from_utf8_unchecked(raw) }));
        }
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(Cow::Borrowed(s)),
            Err(e) => self.bad(at + 1 + e.valid_up_to(), "a string that is not UTF-8"),
        }
    }

    /// An object's key at `pos` (after whitespace) and its `:`. Borrowed bytes unless escaped.
    #[inline(always)]
    fn key(&mut self) -> Scan<Cow<'a, [u8]>> {
        let b = self.next()?;
        if b != b'"' {
            return self.bad(self.pos, format!("expected a key, found {}", show(b)));
        }
        let at = self.pos;
        let (raw, escaped, _) = self.raw_string()?;
        let key = if escaped {
            match unescape(raw) {
                Ok(s) => Cow::Owned(s.into_bytes()),
                Err(message) => return self.bad(at, message),
            }
        } else {
            Cow::Borrowed(raw)
        };
        self.eat(b':', "':'")?;
        Ok(key)
    }

    /// The number at `pos`, checked against JSON's grammar: the shape most numbers of a trace
    /// have (no sign, no exponent, at most 19 digits, not the buffer's last bytes) read inline
    /// into what [`Scanner::number_any`] would give, every other by it.
    #[inline(always)]
    fn number(&mut self) -> Scan<Number<'a>> {
        match self.plain_number() {
            Some(n) => Ok(n),
            None => self.number_any(),
        }
    }

    /// [`Scanner::number`]'s inline part: `None`, nothing consumed, for a number of another
    /// shape, or one a digit or the buffer's end may continue.
    #[inline(always)]
    fn plain_number(&mut self) -> Option<Number<'a>> {
        let b = self.buf;
        let start = self.pos;
        let mut i = start;
        let mut m = 0u64;
        let mut digits = match b.get(i)? {
            b'0' => {
                i += 1;
                1
            }
            b'1'..=b'9' => take_digits(b, &mut i, &mut m),
            _ => return None,
        };
        let mut decimals = 0;
        let float = b.get(i) == Some(&b'.');
        if float {
            i += 1;
            decimals = take_digits(b, &mut i, &mut m);
            if decimals == 0 {
                return None;
            }
            digits += decimals;
        }
        if digits > 19 || matches!(b.get(i), None | Some(b'0'..=b'9' | b'e' | b'E')) {
            return None;
        }
        self.pos = i;
        Some(Number {
            text: &b[start..i],
            negative: false,
            mantissa: Some(m),
            decimals,
            float,
            exponent: false,
        })
    }

    /// Any number at `pos`, checked against JSON's grammar.
    #[inline(never)]
    fn number_any(&mut self) -> Scan<Number<'a>> {
        let b = self.buf;
        let start = self.pos;
        let mut i = start;
        let negative = b.get(i) == Some(&b'-');
        if negative {
            i += 1;
        }
        // Up to 19 digits always fit a u64; `digits` counts them all.
        let mut m = 0u64;
        let mut digits = 0u32;
        match b.get(i) {
            None => return Err(Fault::Cut),
            // No digit may follow a leading zero: the number ends there.
            Some(b'0') => {
                i += 1;
                digits = 1;
            }
            Some(b'1'..=b'9') => digits += take_digits(b, &mut i, &mut m),
            Some(&c) => return self.bad(i, format!("expected a digit, found {}", show(c))),
        }
        let mut decimals = 0u32;
        let mut float = false;
        if b.get(i) == Some(&b'.') {
            float = true;
            i += 1;
            self.digit_at(i)?;
            decimals = take_digits(b, &mut i, &mut m);
            digits += decimals;
        }
        let mut exponent = false;
        if matches!(b.get(i), Some(b'e' | b'E')) {
            float = true;
            exponent = true;
            i += 1;
            if matches!(b.get(i), Some(b'+' | b'-')) {
                i += 1;
            }
            self.digit_at(i)?;
            take_digits(b, &mut i, &mut 0);
        }
        // A number that ends where the bytes end may go on.
        if i == b.len() {
            return Err(Fault::Cut);
        }
        self.pos = i;
        let text = &b[start..i];
        let mantissa = match digits {
            ..=19 => Some(m),
            // 20 digits may still fit.
            20 if !float => std::str::from_utf8(&text[usize::from(negative)..])
                .ok()
                .and_then(|t| t.parse().ok()),
            _ => None,
        };
        Ok(Number {
            text,
            negative,
            mantissa,
            decimals,
            float,
            exponent,
        })
    }

    /// A digit at `i`, as a number's grammar requires there.
    fn digit_at(&self, i: usize) -> Scan<()> {
        match self.buf.get(i) {
            Some(c) if c.is_ascii_digit() => Ok(()),
            Some(&c) => self.bad(i, format!("expected a digit, found {}", show(c))),
            None => Err(Fault::Cut),
        }
    }

    /// Skips the number at `pos` (its first byte a digit from 1 to 9): digits alone are an
    /// integer; anything else goes through [`Scanner::number`]'s checks.
    #[inline(always)]
    fn skip_number(&mut self) -> Scan<()> {
        let b = self.buf;
        let mut i = self.pos + 1;
        while b.get(i).is_some_and(u8::is_ascii_digit) {
            i += 1;
        }
        match b.get(i) {
            Some(b'.' | b'e' | b'E') => self.number().map(drop),
            Some(_) => {
                self.pos = i;
                Ok(())
            }
            None => Err(Fault::Cut),
        }
    }

    /// `true`, `false` or `null` at `pos`.
    fn literal(&mut self, word: &'static [u8]) -> Scan<()> {
        let end = self.pos + word.len();
        match self.buf.get(self.pos..end) {
            Some(w) if w == word => {
                self.pos = end;
                Ok(())
            }
            None if word.starts_with(&self.buf[self.pos..]) => Err(Fault::Cut),
            _ => self.bad(
                self.pos,
                "expected true, false, null, a number, a string, an array or an object",
            ),
        }
    }

    /// Skips the value at `pos` (after whitespace), checking its structure.
    fn skip(&mut self) -> Scan<()> {
        match self.next()? {
            b'"' => self.raw_string().map(drop),
            b'{' | b'[' => {
                if let Some(end) = flat_end(self.buf, self.pos) {
                    self.pos = end;
                    return Ok(());
                }
                self.skip_nested()
            }
            b'1'..=b'9' => self.skip_number(),
            b'-' | b'0' => self.number().map(drop),
            b't' => self.literal(b"true"),
            b'f' => self.literal(b"false"),
            b'n' => self.literal(b"null"),
            b => self.bad(self.pos, format!("expected a value, found {}", show(b))),
        }
    }

    /// Skips the array or object at `pos` to its matching bracket: 64 bytes at a time as bit
    /// masks, the strings found by the parity of their quotes; a block with a backslash, and
    /// the last bytes, byte by byte.
    fn skip_nested(&mut self) -> Scan<()> {
        self.walk_nested::<false>().map(drop)
    }

    /// [`Scanner::skip`] for an event's `args`: where it is an object, skipped as
    /// [`Scanner::skip_nested`] skips one, with where the values of [`ARGS_KEYS`] at its own level
    /// lie ([`ArgsAt`]), found among the string openings and brackets of the same bit masks.
    fn skip_args(&mut self) -> Scan<ArgsAt> {
        if self.next()? != b'{' {
            return self.skip().map(|()| ArgsAt::default());
        }
        if let Some(end) = flat_end(self.buf, self.pos) {
            // No string in it: no key.
            self.pos = end;
            return Ok(ArgsAt {
                known: true,
                ..ArgsAt::default()
            });
        }
        self.walk_nested::<true>()
    }

    /// The walk of [`Scanner::skip_nested`], to the array's or object's matching bracket; with
    /// `KEYS`, the strings opened at its own level are looked at too, for where the values of
    /// [`ARGS_KEYS`] lie (else what it returns says nothing). Its blocks' masks by AVX2 where
    /// the CPU has it ([`block_avx2`]), else by SSE2.
    #[inline(always)]
    fn walk_nested<const KEYS: bool>(&mut self) -> Scan<ArgsAt> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2.
            return unsafe { self.walk_nested_avx2::<KEYS>() };
        }
        self.walk_nested_by::<KEYS, false>()
    }

    /// [`Scanner::walk_nested`] compiled for AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    fn walk_nested_avx2<const KEYS: bool>(&mut self) -> Scan<ArgsAt> {
        self.walk_nested_by::<KEYS, true>()
    }

    /// The walk, its blocks' masks by [`block_avx2`] where `AVX2` (called only from code
    /// compiled for it), else by [`block`].
    #[inline(always)]
    fn walk_nested_by<const KEYS: bool, const AVX2: bool>(&mut self) -> Scan<ArgsAt> {
        let b = self.buf;
        let start = self.pos;
        let mut found = ArgsAt {
            known: true,
            ..ArgsAt::default()
        };
        let mut w = Walk::default();
        let mut i = start;
        while let Some(bytes) = b.get(i..i + 64) {
            let Ok(bytes) = <&[u8; 64]>::try_from(bytes) else {
                break;
            };
            #[cfg(target_arch = "x86_64")]
            let m = if AVX2 {
                // SAFETY: with `AVX2`, this runs in `walk_nested_avx2`, called where the CPU
                // has it.
                unsafe { block_avx2(bytes) }
            } else {
                block(bytes)
            };
            #[cfg(not(target_arch = "x86_64"))]
            let m = block(bytes);
            if m.backslashes != 0 || w.escaped {
                found.known = false;
                if let Some(end) = self.walk_bytes(&mut w, i, i + 64)? {
                    self.pos = end;
                    return Ok(found);
                }
                i += 64;
                continue;
            }
            let carry = if w.in_string { !0 } else { 0 };
            let inside = prefix_xor(m.quotes) ^ carry;
            w.in_string = inside >> 63 == 1;
            let brackets = (m.opens | m.closes) & !inside;
            // Brackets, and (with `KEYS`) the quotes that open a string, in the order they stand.
            let mut marks = if KEYS {
                brackets | (m.quotes & inside)
            } else {
                brackets
            };
            while marks != 0 {
                let k = marks.trailing_zeros();
                let j = i + k as usize;
                if !KEYS || brackets >> k & 1 == 1 {
                    if self.bracket(&mut w, j)? {
                        self.pos = j + 1;
                        return Ok(found);
                    }
                } else if w.depth == 1 {
                    found.key(b, j, start);
                }
                marks &= marks - 1;
            }
            i += 64;
        }
        found.known = false;
        match self.walk_bytes(&mut w, i, b.len())? {
            Some(end) => {
                self.pos = end;
                Ok(found)
            }
            None => Err(Fault::Cut),
        }
    }

    /// Walks bytes `from..to` of a skipped array or object one at a time: where its last
    /// bracket closes, `None` if it does not close there.
    fn walk_bytes(&self, w: &mut Walk, from: usize, to: usize) -> Scan<Option<usize>> {
        for j in from..to {
            let c = self.buf[j];
            if w.in_string {
                if w.escaped {
                    w.escaped = false;
                } else if c == b'\\' {
                    w.escaped = true;
                } else if c == b'"' {
                    w.in_string = false;
                }
                continue;
            }
            match c {
                b'"' => w.in_string = true,
                b'{' | b'[' | b'}' | b']' if self.bracket(w, j)? => return Ok(Some(j + 1)),
                _ => {}
            }
        }
        Ok(None)
    }

    /// The bracket at `j`, outside strings: `true` when it closes the outermost.
    #[inline(always)]
    fn bracket(&self, w: &mut Walk, j: usize) -> Scan<bool> {
        let c = self.buf[j];
        if c == b'{' || c == b'[' {
            if w.depth == MAX_DEPTH {
                return self.bad(j, format!("nested more than {MAX_DEPTH} deep"));
            }
            w.open = (w.open << 1) | u128::from(c == b'{');
            w.depth += 1;
            return Ok(false);
        }
        if (w.open & 1 == 1) != (c == b'}') {
            let want = if w.open & 1 == 1 { '}' } else { ']' };
            return self.bad(j, format!("expected {want:?}, found {}", show(c)));
        }
        w.open >>= 1;
        w.depth -= 1;
        Ok(w.depth == 0)
    }

    /// One of [`FIELDS`] as the key at `pos` (its opening quote), found by one word compare
    /// and consumed with its closing quote (not the `:`), as its index there; `None` (nothing
    /// consumed) for any other key, one with an escape, or one the buffer may cut:
    /// [`Scanner::key`] reads those.
    #[inline(always)]
    fn event_key(&mut self) -> Option<usize> {
        /// A key with its quotes, as the low bytes of a word, and their count.
        const fn quoted(key: &[u8]) -> (u64, u32) {
            let (w, n) = packed(&[b"\"", key, b"\""]);
            assert!(n <= 8, "a field's key is longer than a word");
            (w as u64, n as u32)
        }
        const KEYS: [(u64, u32); FIELDS.len()] = {
            let mut keys = [(0, 0); FIELDS.len()];
            let mut i = 0;
            while i < FIELDS.len() {
                keys[i] = quoted(FIELDS[i].as_bytes());
                i += 1;
            }
            keys
        };
        if self.pos + 8 > self.buf.len() {
            return None;
        }
        /// The fields whose key begins with each byte, at most two (`NONE` for none), so that
        /// one or two compares find a key: built from `FIELDS` (a third would not compile).
        const NONE: u8 = u8::MAX;
        const BY_FIRST: [[u8; 2]; 256] = {
            let mut by = [[NONE; 2]; 256];
            let mut i = 0;
            while i < FIELDS.len() {
                let first = FIELDS[i].as_bytes()[0] as usize;
                let slot = if by[first][0] == NONE { 0 } else { 1 };
                assert!(
                    by[first][slot] == NONE,
                    "three fields begin with one letter"
                );
                by[first][slot] = i as u8;
                i += 1;
            }
            by
        };
        let w = word(self.buf, self.pos);
        for field in BY_FIRST[usize::from((w >> 8) as u8)] {
            let Some(&(key, len)) = KEYS.get(usize::from(field)) else {
                break;
            };
            if w & (u64::MAX >> (64 - 8 * len)) == key {
                self.pos += len as usize;
                return Some(usize::from(field));
            }
        }
        None
    }

    /// The member after `field` in the order Kineto writes an event's (`FIELDS`' order),
    /// when it follows as Kineto writes it — `, "key": ` — told by one 16-byte compare and
    /// consumed, as its index; `None` (nothing consumed) for anything else, read then as
    /// JSON ([`Scanner::more`], [`Scanner::event_key`]). Where the key stands, for errors:
    /// two bytes after the position before.
    #[inline(always)]
    fn kineto_member(&mut self, field: usize) -> Option<usize> {
        /// `, "key": ` as the low bytes of 16, with the mask of those bytes and their count.
        const fn member(key: &[u8]) -> (u128, u128, usize) {
            let (text, n) = packed(&[b", \"", key, b"\": "]);
            (text, u128::MAX >> (128 - 8 * n), n)
        }
        const MEMBERS: [(u128, u128, usize); FIELDS.len()] = {
            let mut m = [(0, 0, 0); FIELDS.len()];
            let mut i = 0;
            while i < FIELDS.len() {
                m[i] = member(FIELDS[i].as_bytes());
                i += 1;
            }
            m
        };
        let &(text, mask, len) = MEMBERS.get(field + 1)?;
        let bytes = self.buf.get(self.pos..self.pos + 16)?;
        let mut w = [0u8; 16];
        w.copy_from_slice(bytes);
        if u128::from_le_bytes(w) & mask != text {
            return None;
        }
        self.pos += len;
        Some(field + 1)
    }

    /// A string or null, for a field named `field`.
    fn opt_str(&mut self, field: &str) -> Scan<Option<Cow<'a, str>>> {
        match self.next()? {
            b'"' => self.string().map(Some),
            b'n' => self.literal(b"null").map(|()| None),
            b => self.bad(
                self.pos,
                format!("`{field}`: expected a string, found {}", show(b)),
            ),
        }
    }

    /// A number or null, for a field named `field`.
    fn opt_f64(&mut self, field: &str) -> Scan<Option<f64>> {
        match self.next()? {
            b'-' | b'0'..=b'9' => self.number().map(|n| Some(n.f64())),
            b'n' => self.literal(b"null").map(|()| None),
            b => self.bad(
                self.pos,
                format!("`{field}`: expected a number, found {}", show(b)),
            ),
        }
    }

    /// A time or null, for a field named `field`: as [`Scanner::opt_f64`], and split at its
    /// point ([`Number::split`]).
    fn opt_time(&mut self, field: &str) -> Scan<Time> {
        match self.next()? {
            b'-' | b'0'..=b'9' => self.number().map(|n| (Some(n.f64()), n.split())),
            b'n' => self.literal(b"null").map(|()| (None, None)),
            b => self.bad(
                self.pos,
                format!("`{field}`: expected a number, found {}", show(b)),
            ),
        }
    }

    /// A number, a string or null, for a field named `field`.
    fn opt_id(&mut self, field: &str) -> Scan<Option<Id<'a>>> {
        match self.next()? {
            b'-' | b'0'..=b'9' => self.number().map(|n| Some(Id::Num(n.i64()))),
            b'"' => self.string().map(|s| Some(Id::Str(s))),
            b'n' => self.literal(b"null").map(|()| None),
            b => self.bad(
                self.pos,
                format!(
                    "`{field}`: expected a number or a string, found {}",
                    show(b)
                ),
            ),
        }
    }

    /// A non-negative integer or null; anything else is skipped and clears `ok`.
    fn opt_u64(&mut self, ok: &mut bool) -> Scan<Option<u64>> {
        match self.next()? {
            b'0'..=b'9' => {
                let n = self.number()?.u64();
                *ok &= n.is_some();
                Ok(n)
            }
            b'n' => self.literal(b"null").map(|()| None),
            _ => {
                *ok = false;
                self.skip().map(|()| None)
            }
        }
    }

    /// An array of strings or null; anything else is skipped and clears `ok`.
    fn opt_strings(&mut self, ok: &mut bool) -> Scan<Option<Vec<String>>> {
        match self.next()? {
            b'[' => self.pos += 1,
            b'n' => return self.literal(b"null").map(|()| None),
            _ => {
                *ok = false;
                return self.skip().map(|()| None);
            }
        }
        let mut out = Vec::new();
        if self.next()? == b']' {
            self.pos += 1;
            return Ok(Some(out));
        }
        loop {
            if self.next()? == b'"' {
                out.push(self.string()?.into_owned());
            } else {
                *ok = false;
                self.skip()?;
            }
            if !self.more(b']')? {
                return Ok(Some(out));
            }
        }
    }

    /// The `args` analysis reads. As when serde read them: when one of them has another
    /// type, or is given twice, or `args` is no object, none are taken.
    fn args(&mut self) -> Scan<Args> {
        if self.next()? != b'{' {
            self.skip()?;
            return Ok(Args::default());
        }
        self.pos += 1;
        let mut args = Args::default();
        if self.next()? == b'}' {
            self.pos += 1;
            return Ok(args);
        }
        let mut ok = true;
        let mut seen = 0u8;
        loop {
            let key = self.key()?;
            let field = ARGS_KEYS.iter().position(|k| *k == &*key);
            if let Some(field) = field {
                ok &= seen & (1 << field) == 0;
                seen |= 1 << field;
                self.arg(field, &mut args, &mut ok)?;
            } else {
                self.skip()?;
            }
            if !self.more(b'}')? {
                return Ok(if ok { args } else { Args::default() });
            }
        }
    }

    /// The value at `pos` of the field of [`Args`] at `field` of [`ARGS_KEYS`], into `args`;
    /// one of another type is skipped and clears `ok`.
    fn arg(&mut self, field: usize, args: &mut Args, ok: &mut bool) -> Scan<()> {
        match field {
            0 => args.correlation = self.opt_u64(ok)?,
            1 => args.device = self.opt_u64(ok)?,
            2 => args.record_function_id = self.opt_u64(ok)?,
            3 => args.requests = self.opt_strings(ok)?,
            _ => args.stream = self.opt_u64(ok)?,
        }
        Ok(())
    }

    /// Skips an event: its own members (or elements) checked against the grammar, their
    /// values for structure.
    fn skip_event(&mut self) -> Scan<()> {
        let close = match self.next()? {
            b'{' => b'}',
            b'[' => b']',
            _ => return self.skip(),
        };
        self.pos += 1;
        if self.next()? == close {
            self.pos += 1;
            return Ok(());
        }
        loop {
            if close == b'}' {
                self.key()?;
            }
            self.skip()?;
            if !self.more(close)? {
                return Ok(());
            }
        }
    }

    /// Where the value at `pos` (after whitespace) starts and its bytes, passed over by
    /// `skip` ([`Scanner::skip`] for a value, [`Scanner::skip_event`] for an event).
    fn skipped(&mut self, skip: fn(&mut Self) -> Scan<()>) -> Scan<(usize, &'a [u8])> {
        self.next()?;
        let start = self.pos;
        skip(self)?;
        Ok((start, &self.buf[start..self.pos]))
    }
}

impl RawArgs<'_> {
    /// The fields analysis reads (see [`Event::args`]): the values the scanner found as it
    /// skipped the object, else every key read again.
    pub fn read(&self) -> Args {
        if !self.at.known {
            return Scanner::new(self.bytes).args().unwrap_or_default();
        }
        let mut args = Args::default();
        let mut ok = !self.at.twice;
        for (field, &at) in self.at.at.iter().enumerate() {
            if at == 0 {
                continue;
            }
            let mut s = Scanner {
                buf: self.bytes,
                pos: at as usize,
            };
            if s.arg(field, &mut args, &mut ok).is_err() {
                return Args::default();
            }
        }
        if ok {
            args
        } else {
            Args::default()
        }
    }
}

impl Event<'_> {
    /// The arguments analysis reads (all absent when `args` is not an object, or one of them
    /// has another type or is given twice, as when serde read them).
    pub fn args(&self) -> Args {
        self.raw_args.map(|a| a.read()).unwrap_or_default()
    }
}

/// Field names of [`Event`], in the order of its bits in the duplicate check.
const FIELDS: [&str; 8] = ["ph", "cat", "name", "pid", "tid", "ts", "dur", "args"];

impl<'de> FromTrace<'de> for Event<'de> {
    fn scan(s: &mut Scanner<'de>) -> Scan<Self> {
        let open = s.next()?;
        if open != b'{' {
            return s.bad(
                s.pos,
                format!("expected an event object, found {}", show(open)),
            );
        }
        s.pos += 1;
        let mut e = Event::default();
        if s.next()? == b'}' {
            s.pos += 1;
            return Ok(e);
        }
        let mut seen = 0u8;
        let mut member = None;
        loop {
            let (at, field) = match member.take() {
                Some(known) => known,
                None => {
                    s.next()?;
                    let at = s.pos;
                    let field = match s.event_key() {
                        Some(field) => {
                            s.eat(b':', "':'")?;
                            field
                        }
                        None => {
                            let key = s.key()?;
                            (FIELDS.iter().position(|f| f.as_bytes() == &*key))
                                .unwrap_or(FIELDS.len())
                        }
                    };
                    (at, field)
                }
            };
            if field < FIELDS.len() {
                if seen & (1 << field) != 0 {
                    return s.bad(at, format!("duplicate field `{}`", FIELDS[field]));
                }
                seen |= 1 << field;
            }
            match field {
                0 => e.ph = s.opt_str("ph")?,
                1 => e.cat = s.opt_str("cat")?,
                2 => e.name = s.opt_str("name")?,
                3 => e.pid = s.opt_id("pid")?,
                4 => e.tid = s.opt_id("tid")?,
                5 => (e.ts, e.ts_split) = s.opt_time("ts")?,
                6 => e.dur = s.opt_f64("dur")?,
                7 => {
                    s.next()?;
                    let start = s.pos;
                    // Where they will be read, their keys found as they are skipped (any
                    // other event's are read in full if asked for).
                    let at = match (&e.cat, &e.name) {
                        (Some(cat), Some(name)) if !args_read(cat, name) => {
                            s.skip()?;
                            ArgsAt::default()
                        }
                        _ => s.skip_args()?,
                    };
                    let bytes = &s.buf[start..s.pos];
                    // As serde reads an `Option`: null is none.
                    e.raw_args = (bytes != b"null").then_some(RawArgs { bytes, at });
                }
                _ => s.skip()?,
            }
            let before = s.pos;
            if let Some(next) = s.kineto_member(field) {
                member = Some((before + 2, next));
                continue;
            }
            if !s.more(b'}')? {
                return Ok(e);
            }
        }
    }
}

impl<'de> FromTrace<'de> for RawEvent<'de> {
    fn scan(s: &mut Scanner<'de>) -> Scan<Self> {
        let (start, bytes) = s.skipped(Scanner::skip_event)?;
        match std::str::from_utf8(bytes) {
            Ok(text) => Ok(RawEvent { text }),
            Err(e) => s.bad(start + e.valid_up_to(), "an event that is not UTF-8"),
        }
    }
}

impl<'de> FromTrace<'de> for Skip {
    fn scan(s: &mut Scanner<'de>) -> Scan<Self> {
        s.skip_event().map(|()| Skip)
    }
}

impl<'de> FromTrace<'de> for IgnoredAny {
    fn scan(s: &mut Scanner<'de>) -> Scan<Self> {
        s.skip_event().map(|()| IgnoredAny)
    }
}

impl<'de, T: Deserialize<'de>> FromTrace<'de> for Serde<T> {
    fn scan(s: &mut Scanner<'de>) -> Scan<Self> {
        let (start, bytes) = s.skipped(Scanner::skip_event)?;
        match serde_json::from_slice(bytes) {
            Ok(v) => Ok(Serde(v)),
            Err(e) => s.bad(start, e.to_string()),
        }
    }
}

/// A string's bytes with their escapes replaced (`Err`: what is wrong).
fn unescape(raw: &[u8]) -> Result<String, String> {
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    let hex = |i: usize| -> Result<u32, String> {
        let digits = raw
            .get(i..i + 4)
            .and_then(|h| std::str::from_utf8(h).ok())
            .ok_or("a \\u escape with fewer than 4 hex digits")?;
        u32::from_str_radix(digits, 16).map_err(|_| format!("invalid \\u escape {digits:?}"))
    };
    while i < raw.len() {
        let b = raw[i];
        if b != b'\\' {
            out.push(b);
            i += 1;
            continue;
        }
        let Some(&e) = raw.get(i + 1) else {
            return Err("a string ending in a backslash".into());
        };
        i += 2;
        let c = match e {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let hi = hex(i)?;
                i += 4;
                let code = if (0xD800..0xDC00).contains(&hi) {
                    let lo = match (raw.get(i..i + 2), hex(i + 2)) {
                        (Some(b"\\u"), Ok(lo)) if (0xDC00..0xE000).contains(&lo) => lo,
                        _ => return Err("a lone leading surrogate in a \\u escape".into()),
                    };
                    i += 6;
                    0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                } else {
                    hi
                };
                char::from_u32(code).ok_or("a lone trailing surrogate in a \\u escape")?
            }
            other => return Err(format!("invalid escape \\{}", char::from(other))),
        };
        let mut utf8 = [0u8; 4];
        out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
    }
    String::from_utf8(out).map_err(|_| "a string that is not UTF-8".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(json: &str) -> Result<Event<'_>, Fault> {
        let mut s = Scanner::new(json.as_bytes());
        Event::scan(&mut s)
    }

    fn serde_event(json: &str) -> Event<'_> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn times_keep_their_written_digits() {
        let split = |json: &str| event(json).unwrap().ts_split;
        assert_eq!(
            split(r#"{"ts": 1661203462598738}"#),
            Some((1661203462598738, 0.0))
        );
        let (whole, frac) = split(r#"{"ts": 1680536718123456.789}"#).unwrap();
        assert_eq!(whole, 1680536718123456);
        assert!((frac - 0.789).abs() < 1e-12, "{frac}");
        let (whole, frac) = split(r#"{"ts": -2.5}"#).unwrap();
        assert_eq!((whole, frac), (-2, -0.5));
        // An exponent, or more digits than a u64 holds: the double alone.
        assert_eq!(split(r#"{"ts": 1.5e3}"#), None);
        assert_eq!(split(r#"{"ts": 12345678901234567890.5}"#), None);
        assert_eq!(split(r#"{"ts": null}"#), None);
    }

    #[test]
    fn reads_what_serde_reads() {
        for json in [
            r#"{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1661203462598738, "dur": 3.25, "args": {"correlation": 7, "device": 0, "grid": [1, 1, 1], "x": {"y": "]}"}}}"#,
            r#"{"name": "a\"b\\c\u00e9\ud83d\ude00", "pid": "host", "tid": -3, "ts": 1.5e3, "dur": null, "extra": [true, false, null, -0.0e-2]}"#,
            r#"{"ph": "X", "name": "execute_context_1(8)_generation_0(0)", "args": {"Record function id": 4, "requests": ["r1", "r\n2"]}}"#,
            r#"{"args": {"correlation": -1, "device": 3}}"#,
            r#"{"args": {"correlation": 1.0}}"#,
            r#"{"args": {"correlation": 1, "correlation": 2}}"#,
            r#"{"args": {"requests": ["a", 3]}}"#,
            r#"{"args": "text"}"#,
            r#"{"args": null, "ts": 1680536718123456.789, "pid": 18446744073709551615}"#,
            r#"{}"#,
            r#" { "ph" : "i" , "s" : "g" } "#,
        ] {
            let mut ours = event(json).unwrap_or_else(|e| panic!("{json}: {e:?}"));
            let theirs = serde_event(json);
            // The split time is the scanner's alone (serde leaves it `None`); it is checked
            // in `times_keep_their_written_digits`.
            ours.ts_split = None;
            assert_eq!(ours, theirs, "{json}");
            // The args as serde read them, straight from their text.
            let args = theirs
                .raw_args
                .and_then(|r| serde_json::from_str::<Args>(r.text()?).ok())
                .unwrap_or_default();
            assert_eq!(ours.args(), args, "{json}");
        }
    }

    #[test]
    fn members_in_kinetos_order_read_as_json_reads_them() {
        // As Kineto writes an event, and the same JSON spaced otherwise (each member then
        // read as JSON, not by the one compare): the same event, the same as serde's.
        let kineto = r#"{"ph": "X", "cat": "kernel", "name": "gemm", "pid": 0, "tid": 7, "ts": 1661203462598738, "dur": 3.25, "args": {"correlation": 7, "device": 0, "stream": 7}}"#;
        let variants = [
            kineto.to_string(),
            kineto.replace(", ", ","),
            kineto.replace(": ", ":"),
            kineto.replace(", ", " ,  "),
            kineto.replace(", \"", ",\n\t\""),
            // Out of Kineto's order, with a member it does not write between two.
            r#"{"cat": "kernel", "ph": "X", "x": [1], "name": "gemm", "ts": 1661203462598738, "pid": 0, "tid": 7, "args": {"correlation": 7, "device": 0, "stream": 7}, "dur": 3.25}"#.to_string(),
        ];
        // The args' text differs with the spacing: what is read from it is compared.
        fn fields(mut e: Event<'_>) -> (Event<'_>, Args) {
            let args = e.args();
            e.raw_args = None;
            (e, args)
        }
        let want = fields(event(kineto).unwrap());
        assert_eq!((want.1.correlation, want.1.stream), (Some(7), Some(7)));
        for json in &variants {
            let got = event(json).unwrap_or_else(|e| panic!("{json}: {e:?}"));
            let mut serde = serde_event(json);
            serde.ts_split = got.ts_split;
            assert_eq!(got, serde, "{json}");
            assert_eq!(fields(got), want, "{json}");
        }
        // A member given twice is found wherever it stands, the compare's or not.
        let bad = |json: &str| match event(json) {
            Err(Fault::Bad(b)) => (b.at, b.message),
            other => panic!("{json}: {other:?}"),
        };
        // After `ph`, `cat` is the member the compare looks for (with 16 bytes to compare).
        let twice = r#"{"cat": "a", "ph": "X", "cat": "b", "name": "long enough"}"#;
        assert_eq!(bad(twice), (24, "duplicate field `cat`".into()));
        assert_eq!(&twice[24..29], "\"cat\"");
        let twice = r#"{"ph": "X", "cat": "a", "ph": "Y", "name": "long enough"}"#;
        assert_eq!(bad(twice), (24, "duplicate field `ph`".into()));
        // Cut anywhere, Kineto's event asks for more bytes.
        for end in 0..kineto.len() {
            assert_eq!(
                event(&kineto[..end]).map(|_| ()),
                Err(Fault::Cut),
                "cut at {end}"
            );
        }
    }

    #[test]
    fn numbers_are_rounded_correctly() {
        for text in [
            "0",
            "-0",
            "1",
            "12.5",
            "1661203462598738",
            "1680536718123456.789",
            "9007199254740993",
            "0.1",
            "2.2250738585072014e-308",
            "1e22",
            "123456789012345678901234567890",
            "-7.25e-3",
        ] {
            let doc = format!("{text},");
            let mut s = Scanner::new(doc.as_bytes());
            let n = s.number().unwrap();
            assert_eq!(n.f64(), text.parse::<f64>().unwrap(), "{text}");
            assert_eq!(s.pos(), text.len());
        }
    }

    /// The whole-plus-fraction path ([`whole_plus_fraction`]) against the standard parser:
    /// every fraction of up to three digits on wholes near its top and at the epoch's µs (the
    /// midpoints between doubles among them); fractions next to a midpoint in every binade of
    /// the path, with as many decimals as fit 19 digits; and the bounds either side of it.
    #[test]
    fn times_with_a_fraction_are_rounded_correctly() {
        let check = |text: &str| {
            let doc = format!("{text},");
            let n = Scanner::new(doc.as_bytes()).number().unwrap();
            let want: f64 = text.parse().unwrap();
            assert_eq!(n.f64().to_bits(), want.to_bits(), "{text}");
        };
        let mut taken = 0;
        for whole in [1u64 << 40, 1_712_195_495_505_582, (1 << 53) - 1, 1 << 52] {
            for d in 1..=3u32 {
                for k in 0..10u64.pow(d) {
                    let text = format!("{whole}.{k:0width$}", width = d as usize);
                    check(&text);
                    check(&format!("-{text}"));
                    let doc = format!("{text},");
                    let n = Scanner::new(doc.as_bytes()).number().unwrap();
                    // Counted where `f64` takes the path: past the one-division one.
                    let m = n.mantissa.unwrap();
                    taken += usize::from(m >= 1 << 53 && whole_plus_fraction(m, d).is_some());
                }
            }
        }
        assert!(taken > 3000, "the path was taken {taken} times");
        // Fractions next to a midpoint between two doubles, in every binade of the path, with
        // as many decimals as fit 19 digits (at least 1e-10 from the midpoint, so the sum is
        // exact there too: this checks the code, the proof covers the rest).
        let mut x = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut near = 0;
        for e in 40..53u32 {
            for _ in 0..4000 {
                let whole = (1u64 << e) + next() % (1 << e);
                let digits = whole.to_string().len() as u32;
                let d = 1 + next() as u32 % (19 - digits).min(12);
                // A midpoint's fraction is (2j + 1) / 2^(53 - e); its neighbours in d decimals.
                let bits = 53 - e;
                let j = u128::from(next()) % (1u128 << (bits - 1));
                let k = ((2 * j + 1) * 10u128.pow(d)) >> bits;
                for k in [k, k + 1] {
                    if k < 10u128.pow(d) {
                        check(&format!("{whole}.{k:0w$}", w = d as usize));
                        near += 1;
                    }
                }
            }
        }
        assert!(near > 90_000, "{near}");
        // Either side of the path's bounds, each with a mantissa past 2^53 (so past the
        // one-division path): a whole just under 2^40 and 2^40 itself, 2^53 - 1 and 2^53.
        for (text, taken) in [
            ("1099511627775.999999", false),
            ("1099511627776.000001", true),
            ("9007199254740991.999", true),
            ("9007199254740992.001", false),
        ] {
            check(text);
            let doc = format!("{text},");
            let n = Scanner::new(doc.as_bytes()).number().unwrap();
            let m = n.mantissa.unwrap();
            assert!(m >= 1 << 53, "{text}");
            assert_eq!(
                whole_plus_fraction(m, n.decimals).is_some(),
                taken,
                "{text}"
            );
        }
    }

    #[test]
    fn keys_read_by_one_word_compare_are_those_serde_reads() {
        // Each field's key as written plainly (one word compare), with an escape (the key
        // reader), and keys that begin like one of them but are not it.
        let plain = r#"{"ph": "X", "cat": "c", "name": "n", "pid": 1, "tid": 2, "ts": 3, "dur": 4, "args": {"device": 5}}"#;
        let escaped = r#"{"p\u0068": "X", "c\u0061t": "c", "nam\u0065": "n", "\u0070id": 1, "ti\u0064": 2, "t\u0073": 3, "du\u0072": 4, "arg\u0073": {"device": 5}}"#;
        let mut want = event(plain).unwrap();
        want.ts_split = None;
        for json in [plain, escaped] {
            let mut ours = event(json).unwrap_or_else(|e| panic!("{json}: {e:?}"));
            ours.ts_split = None;
            assert_eq!(ours, want, "{json}");
            assert_eq!(ours, serde_event(json), "{json}");
        }
        let near = r#"{"phase": "X", "ca": "c", "names": "n", "pidx": 1, "t": 2, "tss": 3, "durs": 4, "argsx": {}, "pi": 1}"#;
        assert_eq!(event(near).unwrap(), Event::default());
        assert_eq!(serde_event(near), Event::default());
        // A duplicate is one whichever way each was read.
        for (json, at) in [
            (r#"{"ts": 1, "t\u0073": 2}"#, 10),
            (r#"{"t\u0073": 1, "ts": 2}"#, 15),
        ] {
            match event(json) {
                Err(Fault::Bad(b)) => {
                    assert_eq!((b.at, b.message.as_str()), (at, "duplicate field `ts`"))
                }
                other => panic!("{json}: {other:?}"),
            }
        }
    }

    #[test]
    fn cut_events_ask_for_more() {
        let json = r#"{"ph": "X", "ts": 12, "name": "a\"b", "args": {"x": [1, {"y": 2}]}}"#;
        for end in 0..json.len() {
            assert_eq!(
                event(&json[..end]).map(|_| ()),
                Err(Fault::Cut),
                "cut at {end}"
            );
        }
        assert!(event(json).is_ok());
    }

    #[test]
    fn faults_say_what_and_where() {
        let bad = |json: &str| match event(json) {
            Err(Fault::Bad(b)) => (b.at, b.message),
            other => panic!("{json}: {other:?}"),
        };
        assert_eq!(bad(r#"{"a" 1}"#), (5, "expected ':', found '1'".into()));
        assert_eq!(
            bad(r#"{"ts": "12"}"#).1,
            "`ts`: expected a number, found '\"'"
        );
        assert_eq!(
            bad(r#"{"a": [1, 2}}"#),
            (11, "expected ']', found '}'".into())
        );
        assert_eq!(bad(r#"{"a": }"#).1, "expected a value, found '}'");
        assert_eq!(bad(r#"{"a": 01}"#).1, "expected ',' or '}', found '1'");
        assert_eq!(bad(r#"{"a": 1.}"#).1, "expected a digit, found '}'");
        assert_eq!(bad(r#"{"a": nul}"#).0, 6);
        assert_eq!(
            bad(r#"{"name": 1}"#).1,
            "`name`: expected a string, found '1'"
        );
        assert_eq!(
            bad(r#"{"ph": "X", "ph": "M"}"#),
            (12, "duplicate field `ph`".into())
        );
        assert_eq!(bad(r#"[1]"#).1, "expected an event object, found '['");
        assert_eq!(
            bad(r#"{"name": "\ud800"}"#).1,
            "a lone leading surrogate in a \\u escape"
        );
        let deep = format!("{{\"a\": {}{}}}", "[".repeat(200), "]".repeat(200));
        assert!(bad(&deep).1.contains("nested more than 128"));
    }

    /// A value of nested arrays and objects with strings that hold brackets, quotes and
    /// escapes, long enough to span several 64-byte blocks.
    fn random_value(seed: &mut u64, depth: u32, out: &mut String) {
        fn next(seed: &mut u64, n: u64) -> u64 {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            *seed % n
        }
        let pieces = [
            "\"a]}\"",
            "\"\\\"{\"",
            "\"\\\\\"",
            "\"x\\\\\\\"]\"",
            "12.5",
            "null",
            "\"\"",
            "\"\\u005d\"",
            "-3",
            "\"long string of plain text past a block edge\"",
        ];
        let piece = |seed: &mut u64| pieces[next(seed, pieces.len() as u64) as usize];
        if depth == 0 || next(seed, 3) == 0 {
            out.push_str(piece(seed));
            return;
        }
        let object = next(seed, 2) == 0;
        out.push(if object { '{' } else { '[' });
        for k in 0..next(seed, 6) {
            if k > 0 {
                out.push_str(", ");
            }
            if object {
                // A key: one of the strings.
                let mut key = piece(seed);
                while !key.starts_with('"') {
                    key = piece(seed);
                }
                out.push_str(key);
                out.push_str(": ");
            }
            random_value(seed, depth - 1, out);
        }
        out.push(if object { '}' } else { ']' });
    }

    #[test]
    #[cfg(target_arch = "x86_64")]
    fn avx2_and_sse2_walks_are_the_same() {
        if !std::arch::is_x86_feature_detected!("avx2") {
            return; // only SSE2 here: the walks of the other tests are its
        }
        let mut seed = 0x2545_F491_4F6C_DD1Du64;
        let pieces = b"\"\\{}[]:, a\xc3\xa9";
        for round in 0..2000 {
            let mut b = [0u8; 64];
            for x in &mut b {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                *x = pieces[(seed % pieces.len() as u64) as usize];
            }
            // SAFETY: the CPU has AVX2.
            assert_eq!(unsafe { block_avx2(&b) }, block(&b), "round {round}");
        }
        for round in 0..2000 {
            let mut value = String::new();
            random_value(&mut seed, 6, &mut value);
            if !value.starts_with(['{', '[']) {
                continue;
            }
            let doc = format!("{value} ,");
            let walk = |avx2: bool, keys: bool| {
                let mut s = Scanner::new(doc.as_bytes());
                let at = match (avx2, keys) {
                    (false, false) => s.walk_nested_by::<false, false>(),
                    (false, true) => s.walk_nested_by::<true, false>(),
                    // SAFETY: the CPU has AVX2.
                    (true, false) => unsafe { s.walk_nested_avx2::<false>() },
                    // SAFETY: as above.
                    (true, true) => unsafe { s.walk_nested_avx2::<true>() },
                };
                // (ArgsAt has no `==`: its fields, as Debug shows them.)
                format!("{:?} {}", at, s.pos())
            };
            for keys in [false, true] {
                assert_eq!(walk(true, keys), walk(false, keys), "round {round}: {doc}");
            }
        }
    }

    #[test]
    fn blocks_and_bytes_find_the_same_end() {
        let mut seed = 0x9E37_79B9_7F4A_7C15u64;
        for round in 0..3000 {
            let mut value = String::new();
            random_value(&mut seed, 6, &mut value);
            if !value.starts_with(['{', '[']) {
                continue;
            }
            let doc = format!("{value} ,");
            // serde's end of the value is the scanner's, whichever path each block took.
            let mut de = serde_json::Deserializer::from_str(&doc).into_iter::<IgnoredAny>();
            de.next().unwrap().unwrap_or_else(|e| panic!("{doc}: {e}"));
            let mut s = Scanner::new(doc.as_bytes());
            s.skip()
                .unwrap_or_else(|e| panic!("round {round}: {doc}: {e:?}"));
            assert_eq!(s.pos(), de.byte_offset(), "round {round}: {doc}");
            // Cut anywhere, it asks for more; a bracket changed, the byte walk's error.
            for end in [1, value.len() / 2, value.len() - 1] {
                let mut s = Scanner::new(&doc.as_bytes()[..end]);
                assert_eq!(s.skip(), Err(Fault::Cut), "round {round}, cut at {end}");
            }
            let last = value.len() - 1;
            let mut broken = doc.clone().into_bytes();
            broken[last] = if broken[last] == b'}' { b']' } else { b'}' };
            let mut blocks = Scanner::new(&broken);
            let by_blocks = blocks.skip();
            let bytes = Scanner::new(&broken);
            let by_bytes = bytes.walk_bytes(&mut Walk::default(), 0, broken.len());
            match (by_blocks, by_bytes) {
                (Err(Fault::Bad(a)), Err(Fault::Bad(b))) => {
                    assert_eq!((a.at, &a.message), (b.at, &b.message), "round {round}")
                }
                other => panic!("round {round}: {other:?}"),
            }
        }
    }

    #[test]
    fn strings_are_checked_as_utf8_wherever_their_bytes_lie() {
        // A name of every length up to 40 (the 16-byte, 8-byte and byte-by-byte searches),
        // with a non-ASCII character, or a byte that is no UTF-8, at every place.
        for len in 0..40 {
            for at in 0..=len {
                for odd in ["é", "\u{1F600}", "\u{80}"] {
                    let mut name = "a".repeat(len);
                    name.insert_str(at, odd);
                    let json = format!("{{\"name\": \"{name}\", \"ph\": \"X\"}}");
                    let e = event(&json).unwrap_or_else(|e| panic!("{json}: {e:?}"));
                    assert_eq!(e.name.as_deref(), Some(name.as_str()));
                }
                let mut bytes = format!("{{\"name\": \"{}\"}}", "a".repeat(len)).into_bytes();
                bytes.insert(10 + at, 0xFF);
                let mut s = Scanner::new(&bytes);
                match Event::scan(&mut s) {
                    Err(Fault::Bad(b)) => {
                        assert_eq!(
                            (b.at, b.message.as_str()),
                            (10 + at, "a string that is not UTF-8")
                        )
                    }
                    other => panic!("len {len}, at {at}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn raw_skip_and_serde_find_the_same_end() {
        let json = r#"{"name": "x", "args": {"a": [1, "]"]}} , next"#;
        for bad in [r#"{"a": }"#, r#"{"a" 1}"#, r#"{"a": 1 "b": 2}"#, r#"[1 2]"#] {
            let mut s = Scanner::new(bad.as_bytes());
            assert!(matches!(Skip::scan(&mut s), Err(Fault::Bad(_))), "{bad}");
        }
        let end = json.find(" ,").unwrap();
        let mut s = Scanner::new(json.as_bytes());
        assert_eq!(RawEvent::scan(&mut s).unwrap().text(), &json[..end]);
        let mut s = Scanner::new(json.as_bytes());
        Skip::scan(&mut s).unwrap();
        assert_eq!(s.pos(), end);
        let mut s = Scanner::new(json.as_bytes());
        let Serde(v) = Serde::<serde_json::Value>::scan(&mut s).unwrap();
        assert_eq!(v["args"]["a"][1], "]");
    }

    /// The inline path of [`Scanner::number`] gives what [`Scanner::number_any`] gives, or
    /// leaves the number to it: every shape of number, each followed by every kind of byte
    /// that may end it, and cut by the buffer's end.
    #[test]
    fn plain_numbers_read_inline_are_those_the_full_reader_gives() {
        let mut texts: Vec<String> = [
            "0",
            "7",
            "10",
            "01",
            "0.5",
            "00",
            "1.",
            "1.0",
            "12.25",
            "-3",
            "-0.5",
            "1e3",
            "2E-2",
            "1.5e+7",
            "0.0001",
            "9007199254740993",
            "1682725898082381",
            "1712195495505582.988",
            "1234567890123456789",
            "12345678901234567890",
            "1234567890.123456789",
            "123456789012.3456789",
            "99999999999999999999.5",
        ]
        .iter()
        .map(|t| t.to_string())
        .collect();
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        for _ in 0..2000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let whole = x % 10u64.pow((x >> 60) as u32 % 19 + 1);
            texts.push(match (x >> 56) % 4 {
                0 => whole.to_string(),
                1 => format!("{whole}.{}", x % 1000),
                2 => format!("{whole}.{:07}", (x >> 8) % 10_000_000),
                _ => format!("{}.{}", whole % 1000, x >> 40),
            });
        }
        let fields = |s: &Scanner<'_>, n: &Number<'_>| {
            (
                n.text.to_vec(),
                n.negative,
                n.mantissa,
                n.decimals,
                n.float,
                n.exponent,
                s.pos(),
            )
        };
        let mut inline = 0;
        for text in &texts {
            for end in ["", ",", "}", " ", "]", "\n", "x", "e", "."] {
                let doc = format!("{text}{end}");
                let mut any = Scanner::new(doc.as_bytes());
                let want = any.number_any().map(|n| fields(&any, &n));
                let mut ours = Scanner::new(doc.as_bytes());
                match ours.plain_number() {
                    Some(n) => {
                        inline += 1;
                        assert_eq!(Ok(fields(&ours, &n)), want, "{doc:?}");
                    }
                    None => assert_eq!(ours.pos(), 0, "{doc:?}: consumed without reading"),
                }
                let mut via = Scanner::new(doc.as_bytes());
                let got = via.number().map(|n| fields(&via, &n));
                assert_eq!(got, want, "{doc:?}");
            }
        }
        assert!(inline > 8000, "{inline} read inline");
    }

    /// `args` keys are read as serde reads them: the five fields, keys that begin or end like
    /// one of them, escapes, and keys near the buffer's end.
    #[test]
    fn args_keys_are_those_serde_reads() {
        let keys = [
            "correlation",
            "device",
            "Record function id",
            "requests",
            "stream",
            "devices",
            "devic",
            "stream2",
            "streams",
            "correlatio",
            "correlationX",
            "correlatiom",
            "Record function ids",
            "record function id",
            "request",
            "requestsX",
            "d\\u0065vice",
            "stre\\u0061m",
            "",
            "x",
        ];
        for key in keys {
            let value = if key.starts_with("req") {
                r#"["r1"]"#
            } else {
                "3"
            };
            for json in [
                format!(r#"{{"{key}": {value}}}"#),
                format!(r#"{{"a": [1, 2], "{key}": {value}, "z": 0}}"#),
                format!(r#"{{"{key}":{value},"correlation":9}}"#),
            ] {
                let ours = Scanner::new(json.as_bytes()).args().unwrap_or_default();
                let theirs = serde_json::from_str::<Args>(&json).unwrap_or_default();
                assert_eq!(ours, theirs, "{json}");
            }
        }
    }

    /// The fields of an event's `args` found as the object is skipped are those reading every
    /// key gives, and serde: keys at the object's own level only (not nested, not a string
    /// value), given twice or of another type, across 64-byte blocks, with escapes (then read
    /// in full), and where the object ends in the buffer's last bytes.
    #[test]
    fn args_found_as_skipped_are_those_read_in_full() {
        let members = [
            ("correlation", "7"),
            ("device", "0"),
            ("stream", "23"),
            ("Record function id", "5"),
            ("requests", r#"["a", "b"]"#),
            ("requests", "null"),
            ("device", r#""x""#),
            ("stream", "-1"),
            ("correlation", "1.5"),
            ("a", r#""device""#),
            ("b", r#""stream""#),
            (
                "nested",
                r#"{"device": 9, "stream": [1, {"correlation": 3}]}"#,
            ),
            ("devices", "1"),
            ("streams", "2"),
            ("d", r#"["stream", "correlation", {"requests": ["z"]}]"#),
            ("grid", "[2400, 1, 1]"),
            ("esc", r#""q\"device\":""#),
            ("dev\\u0069ce", "8"),
            (
                "long",
                "\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"",
            ),
            ("Input Dims", "[[300], [300, 2048], []]"),
            ("e", "{}"),
        ];
        let (seps, colons) = ([", ", ",", ",\n    "], [": ", ":", " : "]);
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let (mut known, mut taken) = (0, 0);
        for _ in 0..4000 {
            let mut json = String::from("{");
            for m in 0..next(9) {
                if m > 0 {
                    json.push_str(seps[next(seps.len())]);
                }
                let (key, value) = members[next(members.len())];
                json.push_str(&format!("\"{key}\"{}{value}", colons[next(colons.len())]));
            }
            json.push('}');
            let want = serde_json::from_str::<Args>(&json).unwrap_or_default();
            let doc = format!("{json}{}", " ".repeat(next(80)));
            let mut s = Scanner::new(doc.as_bytes());
            let at = s.skip_args().unwrap();
            let bytes = &doc.as_bytes()[..s.pos()];
            assert_eq!(bytes, json.as_bytes());
            let all = Scanner::new(bytes).args().unwrap_or_default();
            let found = RawArgs { bytes, at }.read();
            assert_eq!(all, want, "{json}");
            assert_eq!(found, want, "{json}");
            known += usize::from(at.known);
            taken += usize::from(at.known && found != Args::default());
        }
        // Many were read from where the skip found them (1,808 and 388 of them as written).
        assert!(known > 1000 && taken > 300, "{known} {taken}");
    }

    /// A flat array or object told by one 16-byte compare ends where the 64-byte walk ends it,
    /// and a value that is not flat, or is malformed, is left to the walk.
    #[test]
    fn flat_values_end_where_the_walk_ends_them() {
        let mut flat = 0;
        for value in [
            "[]",
            "{}",
            "[2400, 1, 1]",
            "[1,2,3,4,5,6,7,8]",
            "[1, 2, 3, 4, 5, 66]",
            "[[]]",
            "[\"a\"]",
            "[1, {\"a\": 2}]",
            "{\"a\": 1}",
            "[1, 2}",
            "{1]",
            "[1, 2, 3, 4, 5, 6, 7, 8]",
            "[1]]",
            "[  ]",
        ] {
            for pad in 0..20 {
                let doc = format!("{value}{}", " ".repeat(pad));
                let mut walk = Scanner::new(doc.as_bytes());
                let want = walk.skip_nested().map(|()| walk.pos());
                if let Some(end) = flat_end(doc.as_bytes(), 0) {
                    assert_eq!(Ok(end), want, "{doc:?}");
                    flat += 1;
                }
                let mut s = Scanner::new(doc.as_bytes());
                assert_eq!(s.skip().map(|()| s.pos()), want, "{doc:?}");
            }
        }
        // `[]`, `{}`, `[2400, 1, 1]`, `[1]]` and `[  ]`, each wherever 16 bytes follow its
        // opening bracket: 6 + 6 + 16 + 8 + 8 paddings.
        assert_eq!(flat, 44);
    }
}
