//! Files a vendor API keeps for a tenant outside any container (Anthropic's Files API): the
//! uploads a request places into a sandbox, and the files the code wrote, kept after the
//! session ends. Plain files in the data dir, one directory per tenant: `<id>.bin` holds the
//! bytes and `<id>.json` the metadata, written last (and renamed into place, after an fsync),
//! so a file is listed only once it is complete and an acknowledged upload survives a crash.

use std::io::Write as _;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// One stored file's metadata.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub(crate) struct StoredFile {
    pub id: String,
    pub filename: String,
    pub mime_type: String,
    pub size_bytes: u64,
    pub created_at: DateTime<Utc>,
    /// The session whose code wrote it; none for an upload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// What the client said it is for (OpenAI's `purpose`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub purpose: Option<String>,
}

/// The files of one vendor API, under `<data dir>/vendor/<vendor>/files`.
#[derive(Debug, Clone)]
pub(crate) struct FileStore {
    root: PathBuf,
    /// The ids' prefix (`file` for Anthropic's `file_...`).
    prefix: &'static str,
}

impl FileStore {
    pub(crate) fn new(data_dir: &Path, vendor: &str, prefix: &'static str) -> FileStore {
        FileStore {
            root: data_dir.join("vendor").join(vendor).join("files"),
            prefix,
        }
    }

    /// A tenant's directory: named by a hash, as tenant names are free-form text.
    fn dir(&self, tenant: &str) -> PathBuf {
        use sha2::Digest;
        let d = sha2::Sha256::digest(tenant.as_bytes());
        let name: String = d.iter().take(16).map(|b| format!("{b:02x}")).collect();
        self.root.join(name)
    }

    /// A fresh id for [`FileStore::put_as`].
    pub(crate) fn new_id(&self) -> String {
        runcell_engine::new_id(self.prefix)
    }

    /// Whether `id` can name a file of this store (and nothing else: it becomes a file name).
    pub(crate) fn is_id(&self, id: &str) -> bool {
        id.strip_prefix(self.prefix)
            .and_then(|r| r.strip_prefix('_'))
            .is_some_and(|r| {
                !r.is_empty()
                    && r.len() <= 64
                    && r.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            })
    }

    /// Stores `data` as a new file of `tenant`.
    pub(crate) fn put(
        &self,
        tenant: &str,
        filename: &str,
        mime_type: &str,
        data: &[u8],
        session: Option<&str>,
    ) -> std::io::Result<StoredFile> {
        self.put_for(tenant, filename, mime_type, data, session, None)
    }

    /// [`FileStore::put`], recording the file's `purpose`.
    pub(crate) fn put_for(
        &self,
        tenant: &str,
        filename: &str,
        mime_type: &str,
        data: &[u8],
        session: Option<&str>,
        purpose: Option<&str>,
    ) -> std::io::Result<StoredFile> {
        let id = runcell_engine::new_id(self.prefix);
        self.put_as(tenant, &id, filename, mime_type, data, session, purpose)
    }

    /// Stores `data` under the id `id` (one of [`FileStore::new_id`]'s), replacing any file
    /// of that id.
    #[allow(
        clippy::too_many_arguments,
        reason = "the metadata's fields, each named"
    )]
    pub(crate) fn put_as(
        &self,
        tenant: &str,
        id: &str,
        filename: &str,
        mime_type: &str,
        data: &[u8],
        session: Option<&str>,
        purpose: Option<&str>,
    ) -> std::io::Result<StoredFile> {
        if !self.is_id(id) {
            return Err(std::io::Error::other(format!(
                "{id} is not an id of this store"
            )));
        }
        let dir = self.dir(tenant);
        std::fs::create_dir_all(&dir)?;
        let file = StoredFile {
            id: id.to_owned(),
            filename: filename.to_owned(),
            mime_type: mime_type.to_owned(),
            size_bytes: data.len() as u64,
            created_at: Utc::now(),
            session: session.map(str::to_owned),
            purpose: purpose.map(str::to_owned),
        };
        write_durably(&dir, &format!("{}.bin", file.id), data)?;
        let meta = serde_json::to_vec(&file).map_err(std::io::Error::other)?;
        write_durably(&dir, &format!("{}.json", file.id), &meta)?;
        Ok(file)
    }

    /// The metadata of `tenant`'s file `id`; `None` when there is no such file (another
    /// tenant's file does not exist either).
    pub(crate) fn get(&self, tenant: &str, id: &str) -> std::io::Result<Option<StoredFile>> {
        if !self.is_id(id) {
            return Ok(None);
        }
        match std::fs::read(self.dir(tenant).join(format!("{id}.json"))) {
            Ok(b) => serde_json::from_slice(&b)
                .map(Some)
                .map_err(std::io::Error::other),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The file and its bytes.
    pub(crate) fn read(
        &self,
        tenant: &str,
        id: &str,
    ) -> std::io::Result<Option<(StoredFile, Vec<u8>)>> {
        let Some(meta) = self.get(tenant, id)? else {
            return Ok(None);
        };
        match std::fs::read(self.dir(tenant).join(format!("{id}.bin"))) {
            Ok(b) => Ok(Some((meta, b))),
            // Deleted meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Every file of `tenant`, newest first.
    pub(crate) fn list(&self, tenant: &str) -> std::io::Result<Vec<StoredFile>> {
        let dir = self.dir(tenant);
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for e in entries {
            let name = e?.file_name();
            let Some(id) = name.to_str().and_then(|n| n.strip_suffix(".json")) else {
                continue;
            };
            if let Some(f) = self.get(tenant, id)? {
                out.push(f);
            }
        }
        out.sort_by(|a, b| b.created_at.cmp(&a.created_at).then(b.id.cmp(&a.id)));
        Ok(out)
    }

    /// Deletes `tenant`'s file `id`; whether there was one.
    pub(crate) fn delete(&self, tenant: &str, id: &str) -> std::io::Result<bool> {
        if self.get(tenant, id)?.is_none() {
            return Ok(false);
        }
        let dir = self.dir(tenant);
        // The metadata first: from then on the file is not listed.
        std::fs::remove_file(dir.join(format!("{id}.json")))?;
        match std::fs::remove_file(dir.join(format!("{id}.bin"))) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        Ok(true)
    }
}

/// Writes `name` in `dir` through a temporary file, synced, then renamed into place.
fn write_durably(dir: &Path, name: &str, data: &[u8]) -> std::io::Result<()> {
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, dir.join(name))?;
    std::fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_round_trip_per_tenant_and_ids_cannot_escape() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let store = FileStore::new(tmp.path(), "anthropic", "file");
        let a = store
            .put("acme", "a.csv", "text/csv", b"x,y\n1,2\n", None)
            .expect("put");
        let b = store
            .put("acme", "b.png", "image/png", b"png", Some("ses_1"))
            .expect("put");
        assert!(store.is_id(&a.id), "{}", a.id);
        assert_eq!(
            store.read("acme", &a.id).expect("read"),
            Some((a.clone(), b"x,y\n1,2\n".to_vec()))
        );
        // Another tenant sees nothing.
        assert_eq!(store.get("other", &a.id).expect("get"), None);
        assert!(store.list("other").expect("list").is_empty());
        let ids: Vec<String> = store
            .list("acme")
            .expect("list")
            .into_iter()
            .map(|f| f.id)
            .collect();
        assert_eq!(ids.len(), 2);
        assert!(ids.contains(&b.id));
        for bad in [
            "../x",
            "file_../../etc",
            "file_",
            "cntr_abc",
            "file_ABC",
            "file_a/b",
        ] {
            assert!(!store.is_id(bad), "{bad}");
            assert_eq!(store.get("acme", bad).expect("get"), None);
        }
        assert!(store.delete("acme", &a.id).expect("delete"));
        assert!(!store.delete("acme", &a.id).expect("delete again"));
        assert_eq!(store.list("acme").expect("list").len(), 1);
    }
}
