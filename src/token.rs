use std::fmt;

/// The fencing token of one lock grant: a number that strictly increases per key.
///
/// Every successful acquire runs `INCR` on the key's fence counter inside the acquire script, so
/// a later grant of the same key always carries a larger token than an earlier one, across
/// releases, expiries and processes. Pass the token to the storage you write under the lock and
/// have the storage reject any write whose token is lower than the highest it has accepted: a
/// holder that stalled past its lease then cannot overwrite the work of the holder after it.
///
/// Tokens of *different* keys are unrelated.
///
/// ```
/// use fencelock::FencingToken;
///
/// let older = FencingToken::from(41);
/// let newer = FencingToken::from(42);
/// assert!(older < newer);
/// assert_eq!(u64::from(newer), 42);
/// assert_eq!(newer.to_string(), "42");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(u64);

impl FencingToken {
    pub(crate) const fn new(value: u64) -> Self {
        FencingToken(value)
    }

    /// The token as a plain number, for storing next to the data it guards.
    pub const fn as_u64(self) -> u64 {
        self.0
    }
}

/// Rebuilds a token read back from storage, e.g. the highest token a table has accepted.
impl From<u64> for FencingToken {
    fn from(value: u64) -> Self {
        FencingToken(value)
    }
}

impl From<FencingToken> for u64 {
    fn from(token: FencingToken) -> Self {
        token.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}
