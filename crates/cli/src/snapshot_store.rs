//! `serve --snapshot-store s3://BUCKET[/PREFIX]`: durable sessions' snapshots in S3-compatible
//! object storage (AWS S3, MinIO, Ceph, ...) through the `object_store` crate, behind the
//! engine's `SnapshotStore`, so every node of a cluster reads what the others keep and a live
//! node can bring back a dead node's sessions (docs/scale.md).
//!
//! Credentials and the endpoint come from the usual AWS variables (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION` or `AWS_DEFAULT_REGION`,
//! `AWS_ENDPOINT_URL` for a server of your own); an `http://` endpoint is allowed as given
//! (a MinIO on the cluster's own network). The engine is synchronous and calls from its own
//! threads, some of them tokio's: each call runs on a small runtime of this store's own and
//! is waited for on a channel, never with `block_on` inside another runtime.

use std::fs::File;
use std::io::{self, Read, Seek, Write};
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context};
use futures_util::StreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::path::Path as ObjectPath;
use object_store::prefix::PrefixStore;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use runcell_engine::snapshots::{check_key, SnapshotStore};

/// Objects up to this size go up in one PUT; larger ones as a multipart upload (each part
/// this size), which S3 also makes visible only once complete.
const PART_BYTES: usize = 16 << 20;

/// Snapshots as objects under one bucket's prefix.
pub(crate) struct ObjectSnapshots {
    store: Arc<dyn ObjectStore>,
    url: String,
    /// Where a downloaded object is put before the engine reads it (unnamed files).
    tmp: PathBuf,
    rt: tokio::runtime::Runtime,
}

impl std::fmt::Debug for ObjectSnapshots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectSnapshots")
            .field("url", &self.url)
            .finish_non_exhaustive()
    }
}

/// `s3://BUCKET[/PREFIX]` as (bucket, prefix).
fn parse_url(url: &str) -> anyhow::Result<(String, String)> {
    let Some(rest) = url.strip_prefix("s3://") else {
        bail!("--snapshot-store takes s3://BUCKET[/PREFIX] (got {url:?})");
    };
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        bail!("--snapshot-store {url:?} names no bucket: s3://BUCKET[/PREFIX]");
    }
    Ok((bucket.to_owned(), prefix.trim_matches('/').to_owned()))
}

impl ObjectSnapshots {
    /// The store at `url`, configured from the environment; `tmp` under the data dir. Checks
    /// that the bucket answers (one listing) so a wrong endpoint or key stops `serve` at once.
    pub(crate) fn open(url: &str, tmp: PathBuf) -> anyhow::Result<ObjectSnapshots> {
        let (bucket, prefix) = parse_url(url)?;
        // A store that does not answer fails a pause or a snapshot within seconds (the
        // session keeps running), rather than after object_store's default of 3 minutes.
        let retry = object_store::RetryConfig {
            max_retries: 3,
            retry_timeout: std::time::Duration::from_secs(15),
            ..Default::default()
        };
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(&bucket)
            .with_retry(retry);
        let endpoint = std::env::var("AWS_ENDPOINT_URL")
            .or_else(|_| std::env::var("AWS_ENDPOINT"))
            .ok();
        if endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"))
        {
            builder = builder.with_allow_http(true);
        }
        let s3 = builder
            .build()
            .with_context(|| format!("--snapshot-store {url}"))?;
        let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
            Arc::new(s3)
        } else {
            Arc::new(PrefixStore::new(s3, prefix.as_str()))
        };
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("snapshot-store")
            .enable_all()
            .build()
            .context("cannot start the snapshot store's runtime")?;
        let me = ObjectSnapshots {
            store,
            url: url.to_owned(),
            tmp,
            rt,
        };
        let probe = me.store.clone();
        me.run(async move {
            probe
                .list_with_delimiter(None)
                .await
                .map(|_| ())
                .map_err(to_io)
        })
        .with_context(|| format!("--snapshot-store {url}: the bucket does not answer"))?;
        Ok(me)
    }

    /// Runs `f` on the store's runtime and waits for it from any thread.
    fn run<T: Send + 'static>(
        &self,
        f: impl std::future::Future<Output = io::Result<T>> + Send + 'static,
    ) -> io::Result<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        self.rt.spawn(async move {
            let _ = tx.send(f.await);
        });
        rx.recv()
            .map_err(|_| io::Error::other("the snapshot store's runtime stopped"))?
    }

    fn path(key: &str) -> io::Result<ObjectPath> {
        check_key(key)?;
        Ok(ObjectPath::from(key))
    }
}

fn to_io(e: object_store::Error) -> io::Error {
    match e {
        object_store::Error::NotFound { .. } => io::Error::new(io::ErrorKind::NotFound, e),
        e => io::Error::other(e),
    }
}

impl SnapshotStore for ObjectSnapshots {
    fn shared(&self) -> bool {
        true
    }

    fn put(&self, key: &str, from: &mut File) -> io::Result<()> {
        let path = Self::path(key)?;
        let mut first = Vec::new();
        (&mut *from)
            .take(PART_BYTES as u64 + 1)
            .read_to_end(&mut first)?;
        let store = self.store.clone();
        if first.len() <= PART_BYTES {
            return self.run(async move {
                store
                    .put(&path, PutPayload::from(first))
                    .await
                    .map(|_| ())
                    .map_err(to_io)
            });
        }
        // Larger: parts read on this thread, sent on the runtime; nothing is visible under
        // the key until `finish`, and an error aborts the upload.
        let upload = self.run({
            let (store, path) = (store.clone(), path.clone());
            async move { store.put_multipart(&path).await.map_err(to_io) }
        })?;
        let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_BYTES);
        writer.write(&first);
        let mut buf = vec![0u8; PART_BYTES];
        let result = loop {
            match from.read(&mut buf) {
                Ok(0) => break Ok(()),
                Ok(n) => writer.write(&buf[..n]),
                Err(e) => break Err(e),
            }
        };
        match result {
            Ok(()) => self.run(async move { writer.finish().await.map(|_| ()).map_err(to_io) }),
            Err(e) => {
                let _ = self.run(async move { writer.abort().await.map_err(to_io) });
                Err(e)
            }
        }
    }

    fn put_bytes(&self, key: &str, data: &[u8]) -> io::Result<()> {
        let path = Self::path(key)?;
        let store = self.store.clone();
        let data = data.to_vec();
        self.run(async move {
            store
                .put(&path, PutPayload::from(data))
                .await
                .map(|_| ())
                .map_err(to_io)
        })
    }

    /// Downloaded into an unnamed file (gone once closed), read by the engine like a local
    /// snapshot.
    fn open(&self, key: &str) -> io::Result<Option<File>> {
        let path = Self::path(key)?;
        let store = self.store.clone();
        let mut file = tempfile::tempfile_in(&self.tmp)?;
        let mut to = file.try_clone()?;
        let got = self.run(async move {
            let mut stream = match store.get(&path).await {
                Ok(r) => r.into_stream(),
                Err(object_store::Error::NotFound { .. }) => return Ok(false),
                Err(e) => return Err(to_io(e)),
            };
            while let Some(chunk) = stream.next().await {
                to.write_all(&chunk.map_err(to_io)?)?;
            }
            Ok(true)
        })?;
        if !got {
            return Ok(None);
        }
        file.rewind()?;
        Ok(Some(file))
    }

    fn delete(&self, key: &str) -> io::Result<()> {
        let path = Self::path(key)?;
        let store = self.store.clone();
        self.run(async move {
            match store.delete(&path).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(to_io(e)),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parse_url;

    #[test]
    fn urls() {
        assert_eq!(parse_url("s3://b").expect("url"), ("b".into(), "".into()));
        assert_eq!(parse_url("s3://b/").expect("url"), ("b".into(), "".into()));
        assert_eq!(
            parse_url("s3://b/p/q/").expect("url"),
            ("b".into(), "p/q".into())
        );
        for bad in ["", "b/p", "gs://b", "s3://", "s3:///p"] {
            assert!(parse_url(bad).is_err(), "{bad:?}");
        }
    }
}
