//! The tamper-evident audit chain: how a row's hash is computed and how a chain is checked.
//!
//! Each tenant has its own chain. Row `seq` (1, 2, 3, ...) stores `prev_hash` (the hash of row
//! `seq - 1`, or [`GENESIS_HASH`] for row 1) and
//!
//! ```text
//! hash = lowercase_hex( HMAC-SHA-256( chain key, encoding("runcell-audit-v2") ) )   keyed rows
//! hash = lowercase_hex( SHA-256( encoding("runcell-audit-v1") ) )                   legacy rows
//!
//! encoding(domain) = field(domain)             domain separation / format version
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
//! # The chain key
//! Rows are keyed with a 32-byte secret kept outside the database ([`keys`]): someone who can
//! write the database file but not read the key cannot compute a valid hash for an edited,
//! inserted or renumbered row, so recomputing the chain after an edit no longer passes. What the
//! key cannot show is a chain cut short consistently (the newest rows deleted and the head moved
//! back to an older row: every remaining row is genuine), a whole tenant deleted, or a rewrite
//! by someone who also stole the key. Signed checkpoints kept elsewhere ([`signed`]) catch those.
//!
//! # Rows from before the key (legacy)
//! Databases written by a runcell without keyed chains hold unkeyed (v1) rows. When runcell
//! creates the chain key for such a database it records, per tenant, the last unkeyed row
//! (`seq`, `hash`) with an HMAC under the new key (table `audit_legacy`); rows up to that `seq`
//! are checked as SHA-256, rows after it as HMAC. Whether a row is legacy is decided by that
//! keyed anchor, never by anything the row says of itself, so relabelling keyed rows as legacy
//! does not work. The legacy prefix is protected from the moment of keying on (its last hash is
//! fixed by the anchor); a rewrite made *before* keying cannot be detected.

pub mod keys;
pub mod provenance;
pub mod signed;

use hmac::Mac;
use sha2::{Digest, Sha256};

use crate::validate::hex;
use crate::Broken;

pub use keys::ChainKey;

/// `prev_hash` of the first row of every chain: 64 zeros.
pub const GENESIS_HASH: &str = "0000000000000000000000000000000000000000000000000000000000000000";

const DOMAIN_V1: &str = "runcell-audit-v1";
const DOMAIN_V2: &str = "runcell-audit-v2";
const DOMAIN_LEGACY: &str = "runcell-audit-legacy-v1";

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

/// Feeds `field(s)` (length, then bytes) to `out`.
pub(crate) fn field(out: &mut impl FnMut(&[u8]), s: &str) {
    // usize -> u64 never truncates on supported targets.
    out(&(s.len() as u64).to_be_bytes());
    out(s.as_bytes());
}

fn encode(out: &mut impl FnMut(&[u8]), domain: &str, prev_hash: &str, f: &ChainFields<'_>) {
    field(out, domain);
    field(out, prev_hash);
    out(&f.seq.to_be_bytes());
    field(out, f.tenant);
    field(out, f.execution_id);
    match f.session_id {
        None => out(&[0u8]),
        Some(s) => {
            out(&[1u8]);
            field(out, s);
        }
    }
    field(out, f.status);
    field(out, f.code);
    field(out, f.execution_json);
    field(out, f.created_at);
}

/// A legacy (unkeyed, v1) row's hash from its predecessor's hash and its fields: what runcell
/// wrote before chains were keyed, and what anyone can compute.
pub fn chain_hash(prev_hash: &str, f: &ChainFields<'_>) -> String {
    let mut h = Sha256::new();
    encode(&mut |b| h.update(b), DOMAIN_V1, prev_hash, f);
    hex(&h.finalize())
}

/// A keyed (v2) row's hash: HMAC-SHA-256 under the chain key (see the module docs).
pub fn chain_mac(key: &ChainKey, prev_hash: &str, f: &ChainFields<'_>) -> String {
    let mut m = key.mac();
    encode(&mut |b| m.update(b), DOMAIN_V2, prev_hash, f);
    hex(&m.finalize().into_bytes())
}

/// The HMAC of a tenant's legacy anchor: its last unkeyed row `seq` with hash `hash`.
pub fn legacy_mac(key: &ChainKey, tenant: &str, seq: i64, hash: &str) -> String {
    let mut m = key.mac();
    let mut out = |b: &[u8]| m.update(b);
    field(&mut out, DOMAIN_LEGACY);
    field(&mut out, tenant);
    out(&seq.to_be_bytes());
    field(&mut out, hash);
    hex(&m.finalize().into_bytes())
}

/// A tenant's legacy anchor as stored.
#[derive(Debug, Clone)]
pub(crate) struct Legacy {
    pub seq: i64,
    pub hash: String,
    pub mac: String,
}

/// A position a checkpoint fixes: record `count` of the tenant has hash `head`.
#[derive(Debug, Clone)]
pub(crate) struct Expect {
    pub count: i64,
    pub head: String,
    /// Names the checkpoint in a report, e.g. `checkpoint of 2026-01-01T00:00:00Z`.
    pub source: String,
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
pub(crate) struct TenantWalk<'k> {
    tenant: String,
    key: &'k ChainKey,
    head: Option<(i64, String)>,
    legacy: Option<Legacy>,
    /// Positions checkpoints fix, ascending by count.
    expect: Vec<Expect>,
    next_expect: usize,
    expected_seq: i64,
    prev_hash: String,
    last_id: String,
    /// Rows found intact so far.
    pub checked: u64,
}

impl<'k> TenantWalk<'k> {
    pub fn new(
        tenant: &str,
        key: &'k ChainKey,
        head: Option<(i64, String)>,
        legacy: Option<Legacy>,
        mut expect: Vec<Expect>,
    ) -> Self {
        expect.sort_by_key(|e| e.count);
        TenantWalk {
            tenant: tenant.to_owned(),
            key,
            head,
            legacy,
            expect,
            next_expect: 0,
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

    /// Before the first row: the legacy anchor, if any, must carry a valid MAC.
    pub fn start(&mut self) -> Result<(), Broken> {
        // A checkpoint of count 0 fixes nothing but the tenant's existence.
        while self
            .expect
            .get(self.next_expect)
            .is_some_and(|e| e.count <= 0)
        {
            self.next_expect += 1;
        }
        match &self.legacy {
            Some(l) if legacy_mac(self.key, &self.tenant, l.seq, &l.hash) != l.mac => Err(self
                .broken(
                    "",
                    "the anchor of the records from before the chain key was edited (its MAC does \
                     not verify)",
                )),
            _ => Ok(()),
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
        // Whether this row is legacy is the keyed anchor's say, never the row's.
        let legacy = self.legacy.as_ref().filter(|l| f.seq <= l.seq);
        let computed = match legacy {
            Some(_) => chain_hash(r.prev_hash, f),
            None => chain_mac(self.key, r.prev_hash, f),
        };
        if computed != r.hash {
            let reason = if legacy.is_none() && chain_hash(r.prev_hash, f) == r.hash {
                "row edited: hash mismatch (an unkeyed SHA-256 hash where the chain is keyed: \
                 recomputed without the chain key)"
            } else {
                "row edited: hash mismatch"
            };
            return Err(self.broken(id, reason));
        }
        if r.prev_hash != self.prev_hash {
            return Err(self.broken(
                id,
                "row does not link to the previous row (prev_hash mismatch: the previous row was \
                 edited or replaced)",
            ));
        }
        if let Some(l) = legacy {
            if f.seq == l.seq && r.hash != l.hash {
                return Err(self.broken(
                    id,
                    "the records from before the chain key were rewritten (the last one does not \
                     match the anchor taken when the key was created)",
                ));
            }
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
        while let Some(e) = self
            .expect
            .get(self.next_expect)
            .filter(|e| e.count == f.seq)
        {
            if r.hash != e.head {
                return Err(self.broken(
                    id,
                    format!(
                        "record {} differs from the {}: the log was rewritten up to here",
                        f.seq, e.source
                    ),
                ));
            }
            self.next_expect += 1;
        }
        self.expected_seq += 1;
        self.prev_hash = r.hash.to_owned();
        self.last_id = id.to_owned();
        self.checked += 1;
        Ok(())
    }

    /// Called after the last row: the head must point at it, and every record a checkpoint or
    /// the legacy anchor counted must have been seen.
    pub fn finish(&self) -> Result<(), Broken> {
        let last_seq = self.expected_seq - 1;
        if let Some(e) = self.expect.get(self.next_expect) {
            let reason = if last_seq == 0 && self.head.is_none() {
                format!(
                    "the tenant is gone: the {} counted {} records, none is left (the whole \
                     tenant was deleted)",
                    e.source, e.count
                )
            } else {
                format!(
                    "the chain has {last_seq} records but the {} counted {}: records were \
                     deleted",
                    e.source, e.count
                )
            };
            return Err(self.broken(&self.last_id, reason));
        }
        if let Some(l) = &self.legacy {
            if l.seq > last_seq {
                return Err(self.broken(
                    &self.last_id,
                    format!(
                        "the anchor taken when the chain key was created counted {} records, the \
                         chain has {last_seq}: records were deleted",
                        l.seq
                    ),
                ));
            }
        }
        let Some((head_seq, head_hash)) = &self.head else {
            return Ok(()); // no head and (row() would have failed otherwise) no rows
        };
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
    fn the_keyed_hash_depends_on_the_key_and_differs_from_the_unkeyed_one() {
        let f = fields(None, "x");
        let k1 = ChainKey::from_bytes([1; 32]);
        let k2 = ChainKey::from_bytes([2; 32]);
        let h1 = chain_mac(&k1, GENESIS_HASH, &f);
        assert_eq!(h1.len(), 64);
        assert_eq!(h1, chain_mac(&k1, GENESIS_HASH, &f));
        assert_ne!(h1, chain_mac(&k2, GENESIS_HASH, &f));
        assert_ne!(h1, chain_hash(GENESIS_HASH, &f));
        assert_ne!(
            legacy_mac(&k1, "t", 3, GENESIS_HASH),
            legacy_mac(&k1, "t", 4, GENESIS_HASH)
        );
        assert!(
            !format!("{k1:?}").contains(&k1.to_hex()),
            "Debug never shows the key"
        );
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
