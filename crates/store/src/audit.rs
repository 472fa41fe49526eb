//! The tamper-evident audit chain: how a row's hash is computed and how a chain is checked.
//!
//! Each tenant has its own chain. Row `seq` (1, 2, 3, ...) stores `prev_hash` (the hash of row
//! `seq - 1`, or [`GENESIS_HASH`] for row 1) and
//!
//! ```text
//! hash = lowercase_hex( SHA-256( encoding ) )
//!
//! encoding = field("runcell-audit-v1")        domain separation / format version
//!         || field(prev_hash)                  the 64 hex characters, as text
//!         || be_i64(seq)                       8 bytes, big-endian
//!         || field(tenant)
//!         || field(execution_id)
//!         || opt(session_id)
//!         || field(status)
//!         || field(code)
//!         || field(execution_json)
//!         || field(created_at)                 exactly the stored RFC 3339 text
//!
//! field(s) = be_u64(byte length of s) || UTF-8 bytes of s
//! opt(None) = 0x00        opt(Some(s)) = 0x01 || field(s)
//! ```
//!
//! Every variable-length value carries its length, so no two different rows share an encoding.
//! A separate "chain head" per tenant records the last `(seq, hash)` appended, so deleting the
//! newest rows is noticed too.
//!
//! What this does and does not protect against: anyone who edits, deletes or inserts rows
//! without recomputing every later hash *and* the head is detected. Someone with write access
//! to the database who rewrites the whole tail of a chain consistently is not (the hash has no
//! secret key); to catch that, keep a copy of the head elsewhere (e.g. log it) and compare.

use sha2::{Digest, Sha256};

use crate::validate::hex;
use crate::Broken;

/// `prev_hash` of the first row of every chain: 64 zeros.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

const DOMAIN: &str = "runcell-audit-v1";

/// The values of one audit row that its hash covers.
#[derive(Debug, Clone, Copy)]
pub struct ChainFields<'a> {
    /// Position in the tenant's chain, from 1.
    pub seq: i64,
    /// Owning tenant.
    pub tenant: &'a str,
    /// The execution's id.
    pub execution_id: &'a str,
    /// The session it ran in, if any.
    pub session_id: Option<&'a str>,
    /// Final status word.
    pub status: &'a str,
    /// The code that ran.
    pub code: &'a str,
    /// The execution record as JSON text.
    pub execution_json: &'a str,
    /// Creation time exactly as stored.
    pub created_at: &'a str,
}

/// Computes a row's hash from its predecessor's hash and its fields (see the module docs).
pub fn chain_hash(prev_hash: &str, f: &ChainFields<'_>) -> String {
    fn field(h: &mut Sha256, s: &str) {
        // usize -> u64 never truncates on supported targets.
        h.update((s.len() as u64).to_be_bytes());
        h.update(s.as_bytes());
    }
    let mut h = Sha256::new();
    field(&mut h, DOMAIN);
    field(&mut h, prev_hash);
    h.update(f.seq.to_be_bytes());
    field(&mut h, f.tenant);
    field(&mut h, f.execution_id);
    match f.session_id {
        None => h.update([0u8]),
        Some(s) => {
            h.update([1u8]);
            field(&mut h, s);
        }
    }
    field(&mut h, f.status);
    field(&mut h, f.code);
    field(&mut h, f.execution_json);
    field(&mut h, f.created_at);
    hex(&h.finalize())
}

/// One row as read back from storage, for verification.
#[derive(Debug)]
pub(crate) struct StoredRow<'a> {
    pub fields: ChainFields<'a>,
    pub prev_hash: &'a str,
    pub hash: &'a str,
}

/// Walks one tenant's rows in ascending `seq` order. Backend-independent.
#[derive(Debug)]
pub(crate) struct TenantWalk {
    tenant: String,
    head: Option<(i64, String)>,
    expected_seq: i64,
    prev_hash: String,
    last_id: String,
    /// Rows found intact so far.
    pub checked: u64,
}

impl TenantWalk {
    pub fn new(tenant: &str, head: Option<(i64, String)>) -> Self {
        TenantWalk {
            tenant: tenant.to_owned(),
            head,
            expected_seq: 1,
            prev_hash: GENESIS_HASH.to_owned(),
            last_id: String::new(),
            checked: 0,
        }
    }

    pub fn broken(&self, execution_id: &str, reason: impl Into<String>) -> Broken {
        Broken {
            tenant: self.tenant.clone(),
            execution_id: execution_id.to_owned(),
            reason: reason.into(),
        }
    }

    /// Checks the next row; `Err` is the first problem found.
    pub fn row(&mut self, r: &StoredRow<'_>) -> Result<(), Broken> {
        let f = &r.fields;
        let id = f.execution_id;
        if f.seq != self.expected_seq {
            let reason = if f.seq > self.expected_seq {
                format!(
                    "row missing before this one (seq {} expected, found {})",
                    self.expected_seq, f.seq
                )
            } else {
                format!(
                    "unexpected seq (seq {} expected, found {}): row inserted out of band",
                    self.expected_seq, f.seq
                )
            };
            return Err(self.broken(id, reason));
        }
        if chain_hash(r.prev_hash, f) != r.hash {
            return Err(self.broken(id, "row edited: hash mismatch"));
        }
        if r.prev_hash != self.prev_hash {
            return Err(self.broken(
                id,
                "row does not link to the previous row (prev_hash mismatch: the previous row was \
                 edited or replaced)",
            ));
        }
        match &self.head {
            None => {
                return Err(self.broken(
                    id,
                    "no chain head for this tenant (row inserted out of band)",
                ))
            }
            Some((head_seq, _)) if f.seq > *head_seq => {
                return Err(self.broken(id, "row beyond the chain head (inserted out of band)"))
            }
            Some(_) => {}
        }
        self.expected_seq += 1;
        self.prev_hash = r.hash.to_owned();
        self.last_id = id.to_owned();
        self.checked += 1;
        Ok(())
    }

    /// Called after the last row: the head must point at it.
    pub fn finish(&self) -> Result<(), Broken> {
        let Some((head_seq, head_hash)) = &self.head else {
            return Ok(()); // no head and (row() would have failed otherwise) no rows
        };
        let last_seq = self.expected_seq - 1;
        if *head_seq != last_seq {
            return Err(self.broken(
                &self.last_id,
                "chain head does not match the last row (a row was deleted)",
            ));
        }
        if *head_hash != self.prev_hash {
            return Err(self.broken(
                &self.last_id,
                "chain head does not match the last row (the last row was replaced)",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields<'a>(session: Option<&'a str>, code: &'a str) -> ChainFields<'a> {
        ChainFields {
            seq: 1,
            tenant: "t",
            execution_id: "ex_1",
            session_id: session,
            status: "ok",
            code,
            execution_json: "{}",
            created_at: "2024-01-01T00:00:00.000000000Z",
        }
    }

    #[test]
    fn encoding_is_unambiguous() {
        let a = chain_hash(GENESIS_HASH, &fields(None, "x"));
        let b = chain_hash(GENESIS_HASH, &fields(Some(""), "x"));
        let c = chain_hash(GENESIS_HASH, &fields(None, "x "));
        assert_ne!(a, b);
        assert_ne!(a, c);
        assert_eq!(a, chain_hash(GENESIS_HASH, &fields(None, "x")));
        assert_eq!(a.len(), 64);
        // Moving bytes between adjacent fields changes the hash.
        let mut f1 = fields(None, "ab");
        f1.status = "o";
        let mut f2 = fields(None, "ab");
        f2.status = "ok";
        f2.code = "b";
        f1.code = "kb";
        assert_ne!(chain_hash(GENESIS_HASH, &f1), chain_hash(GENESIS_HASH, &f2));
    }
}
