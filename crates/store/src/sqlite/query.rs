//! Running a statement and mapping its rows, and the column types every table shares.

use chrono::{DateTime, Utc};
use rusqlite::{Connection, Params, Row};

use crate::error::{Result, StoreError};
use crate::time;

/// Runs `sql` and maps every row with `f`.
pub(super) fn collect<T>(
    conn: &Connection,
    sql: &str,
    p: impl Params,
    f: impl Fn(&Row<'_>) -> Result<T>,
) -> Result<Vec<T>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(p)?;
    let mut out = Vec::new();
    while let Some(r) = rows.next()? {
        out.push(f(r)?);
    }
    Ok(out)
}

/// Runs `sql` and maps the first row, if any, with `f`.
pub(super) fn first<T>(
    conn: &Connection,
    sql: &str,
    p: impl Params,
    f: impl Fn(&Row<'_>) -> Result<T>,
) -> Result<Option<T>> {
    let mut stmt = conn.prepare_cached(sql)?;
    let mut rows = stmt.query(p)?;
    match rows.next()? {
        Some(r) => Ok(Some(f(r)?)),
        None => Ok(None),
    }
}

/// A timestamp column (RFC 3339 text).
pub(super) fn ts(r: &Row<'_>, i: usize) -> Result<DateTime<Utc>> {
    time::parse(&r.get::<_, String>(i)?)
}

/// A chain position column (never negative).
pub(super) fn seq_of(r: &Row<'_>, i: usize) -> Result<u64> {
    let v: i64 = r.get(i)?;
    u64::try_from(v).map_err(|_| StoreError::Corrupt(format!("negative seq {v}")))
}
