//! The tuning cache: measured times on disk, so a second run measures nothing.
//!
//! One JSON file holds `{"format": 1, "entries": {KEY: ENTRY}}`. A key is
//! the FNV-1a hash (hex) of everything a measurement depends on: the
//! group's canonical text with the candidate's parameters (so its shapes,
//! dtypes and ops), the device's name and compute capability, the driver's
//! and NVRTC's versions and dcir's version ([`Fingerprint`]). An entry holds
//! the median time or why the candidate failed. A file that cannot be read
//! as this format is reported and replaced, never trusted; entries of other
//! devices or versions simply never match.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The file format this build writes and reads.
const FORMAT: u32 = 1;

/// What a measurement depends on besides the kernel itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fingerprint {
    /// Device name and compute capability.
    pub device: String,
    /// Driver and NVRTC versions.
    pub toolchain: String,
}

impl Fingerprint {
    /// The key of a candidate whose standalone graph prints as `group_text`.
    pub fn key(&self, group_text: &str) -> String {
        let text = format!(
            "dcir {}\n{}\n{}\n{group_text}",
            env!("CARGO_PKG_VERSION"),
            self.device,
            self.toolchain
        );
        let h = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        format!("{h:016x}")
    }
}

/// One measured candidate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Entry {
    /// It ran and matched the interpreter: median milliseconds.
    Time(f64),
    /// It did not compile, run or match: why.
    Failed(String),
}

#[derive(Serialize, Deserialize)]
struct File {
    format: u32,
    entries: BTreeMap<String, Entry>,
}

/// The cache, in memory; [`Cache::save`] writes it back.
#[derive(Debug)]
pub struct Cache {
    path: Option<PathBuf>,
    entries: BTreeMap<String, Entry>,
    dirty: bool,
}

impl Cache {
    /// A cache that lives only in memory.
    pub fn in_memory() -> Cache {
        Cache {
            path: None,
            entries: BTreeMap::new(),
            dirty: false,
        }
    }

    /// Loads `path`. A missing file is an empty cache; a file that is not a
    /// cache of this format is replaced on save, and the returned note says so.
    pub fn open(path: &Path) -> (Cache, Option<String>) {
        let mut cache = Cache {
            path: Some(path.to_path_buf()),
            ..Cache::in_memory()
        };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (cache, None),
            Err(e) => {
                cache.dirty = true;
                return (
                    cache,
                    Some(format!(
                        "cannot read tuning cache {}: {e}; rebuilding it",
                        path.display()
                    )),
                );
            }
        };
        Cache::from_text(path, &text)
    }

    /// The cache of `path` whose file holds `text` (what [`Cache::open`]
    /// read): a note when `text` is not a cache of this format, which is then
    /// replaced on save.
    pub fn from_text(path: &Path, text: &str) -> (Cache, Option<String>) {
        let mut cache = Cache {
            path: Some(path.to_path_buf()),
            ..Cache::in_memory()
        };
        match serde_json::from_str::<File>(text) {
            Ok(file) if file.format == FORMAT => {
                cache.entries = file.entries;
                (cache, None)
            }
            Ok(file) => {
                cache.dirty = true;
                let note = format!(
                    "tuning cache {} has format {} (this dcir writes {FORMAT}); rebuilding it",
                    path.display(),
                    file.format
                );
                (cache, Some(note))
            }
            Err(e) => {
                cache.dirty = true;
                let note = format!(
                    "tuning cache {} is corrupt ({e}); rebuilding it",
                    path.display()
                );
                (cache, Some(note))
            }
        }
    }

    /// The entry of `key`.
    pub fn get(&self, key: &str) -> Option<&Entry> {
        self.entries.get(key)
    }

    /// Records a measurement.
    pub fn insert(&mut self, key: String, entry: Entry) {
        self.entries.insert(key, entry);
        self.dirty = true;
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Writes the cache to its file (atomically: a temporary file renamed
    /// over it) when it changed; an in-memory cache writes nothing.
    pub fn save(&mut self) -> Result<(), String> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        if !self.dirty {
            return Ok(());
        }
        let file = File {
            format: FORMAT,
            entries: self.entries.clone(),
        };
        let text = serde_json::to_string_pretty(&file).map_err(|e| e.to_string())?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path)
            .map_err(|e| format!("cannot replace {}: {e}", path.display()))?;
        self.dirty = false;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fingerprint() -> Fingerprint {
        Fingerprint {
            device: "NVIDIA H200 (9.0)".into(),
            toolchain: "driver 13000, nvrtc 13.0".into(),
        }
    }

    #[test]
    fn keys_depend_on_the_group_the_device_and_the_toolchain() {
        let f = fingerprint();
        let k = f.key("graph @g ...");
        assert_eq!(k, f.key("graph @g ..."));
        assert_ne!(k, f.key("graph @h ..."));
        let other = Fingerprint {
            toolchain: "driver 13000, nvrtc 13.5".into(),
            ..fingerprint()
        };
        assert_ne!(k, other.key("graph @g ..."));
    }

    #[test]
    fn entries_survive_a_round_trip_through_the_file() {
        let dir = std::env::temp_dir().join(format!("dcir-tune-cache-{}", std::process::id()));
        let path = dir.join("tune.json");
        let _ = std::fs::remove_file(&path);
        let (mut cache, note) = Cache::open(&path);
        assert!(note.is_none() && cache.is_empty());
        cache.insert("a".into(), Entry::Time(0.25));
        cache.insert("b".into(), Entry::Failed("spills".into()));
        cache.save().expect("saves");
        let (cache, note) = Cache::open(&path);
        assert!(note.is_none());
        assert_eq!(cache.get("a"), Some(&Entry::Time(0.25)));
        assert_eq!(cache.get("b"), Some(&Entry::Failed("spills".into())));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_corrupt_or_foreign_file_is_reported_and_rebuilt() {
        let dir = std::env::temp_dir().join(format!("dcir-tune-corrupt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("tune.json");
        for (text, says) in [
            ("{not json", "corrupt"),
            (r#"{"format": 99, "entries": {}}"#, "format 99"),
        ] {
            std::fs::write(&path, text).expect("writes");
            let (mut cache, note) = Cache::open(&path);
            let note = note.expect("a note");
            assert!(note.contains(says) && note.contains("rebuilding"), "{note}");
            assert!(cache.is_empty());
            cache.save().expect("rebuilds");
            let (_, note) = Cache::open(&path);
            assert!(note.is_none(), "{note:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
