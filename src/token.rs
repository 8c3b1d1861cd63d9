use std::fmt;

use crate::error::{Error, Result};

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

    /// The token as an `i64`, for stores whose integers are signed 64-bit: a SQL `bigint`
    /// (PostgreSQL, MySQL, SQLite's `INTEGER`), a Java `long`.
    ///
    /// Every token a grant carries fits: fence counters are Redis integers, which are signed
    /// 64-bit, so a key's tokens end at `i64::MAX` (2^63 − 1; past it the acquire fails and no
    /// lock is granted), and they start around 1.8 × 10^15, the clock floor. Only a token made
    /// with `FencingToken::from(u64)` from a number above `i64::MAX` does not fit.
    ///
    /// ```
    /// use fencelock::FencingToken;
    ///
    /// let token = FencingToken::from(1_800_000_000_000_042);
    /// assert_eq!(token.as_i64()?, 1_800_000_000_000_042);
    /// // Only numbers no grant can carry are refused:
    /// let err = FencingToken::from(u64::MAX).as_i64().unwrap_err();
    /// assert!(err.is_invalid_argument());
    /// # Ok::<(), fencelock::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a token above `i64::MAX`,
    /// rather than `Option`, so that `?` reports it and a `None` cannot reach a query as a
    /// SQL `NULL`.
    pub fn as_i64(self) -> Result<i64> {
        i64::try_from(self.0).map_err(|_| {
            Error::invalid(
                "token",
                format!(
                    "{} is above i64::MAX, the largest a signed 64-bit integer holds",
                    self.0
                ),
            )
        })
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
