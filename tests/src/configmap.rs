//! A ConfigMap volume as the kubelet writes it: the files live in a timestamped directory,
//! `..data` points at the current one, and each key is a symlink through `..data`. An update
//! writes a new directory and renames a fresh `..data` symlink over the old one, atomically; the
//! files themselves are never written in place.

use std::{
    fs,
    os::unix::fs::symlink,
    path::{Path, PathBuf},
};

/// A ConfigMap volume directory, removed when dropped.
#[derive(Debug)]
pub struct ConfigMapVolume {
    dir: PathBuf,
    generation: u32,
    current: Option<PathBuf>,
    keys: Vec<String>,
}

impl ConfigMapVolume {
    /// An empty volume (no `..data` yet) in a fresh directory.
    pub fn new(name: &str) -> Self {
        let dir = std::env::temp_dir().join(name);
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir)
            .unwrap_or_else(|error| panic!("creating {}: {error}", dir.display()));
        Self {
            dir,
            generation: 0,
            current: None,
            keys: Vec::new(),
        }
    }

    /// The mount point.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path a key is read at.
    pub fn key(&self, key: &str) -> PathBuf {
        self.dir.join(key)
    }

    /// Publishes a new version of the ConfigMap with exactly `files`.
    pub fn update(&mut self, files: &[(&str, &str)]) {
        self.generation += 1;
        let generation = format!(
            "..2026_11_22_01_02_{:02}.{}",
            self.generation % 60,
            self.generation
        );
        let data_dir = self.dir.join(&generation);
        fs::create_dir(&data_dir)
            .unwrap_or_else(|error| panic!("creating {}: {error}", data_dir.display()));
        for (key, contents) in files {
            fs::write(data_dir.join(key), contents)
                .unwrap_or_else(|error| panic!("writing {key}: {error}"));
        }
        let staging = self.dir.join("..data_tmp");
        let _ = fs::remove_file(&staging);
        symlink(&generation, &staging).unwrap_or_else(|error| panic!("symlink: {error}"));
        fs::rename(&staging, self.dir.join("..data"))
            .unwrap_or_else(|error| panic!("swapping ..data: {error}"));
        for (key, _) in files {
            let link = self.dir.join(key);
            if fs::symlink_metadata(&link).is_err() {
                symlink(Path::new("..data").join(key), &link)
                    .unwrap_or_else(|error| panic!("linking {key}: {error}"));
            }
        }
        for stale in self
            .keys
            .iter()
            .filter(|key| !files.iter().any(|(new, _)| new == *key))
        {
            let _ = fs::remove_file(self.dir.join(stale));
        }
        self.keys = files.iter().map(|(key, _)| (*key).to_owned()).collect();
        if let Some(previous) = self.current.replace(data_dir) {
            let _ = fs::remove_dir_all(previous);
        }
    }
}

impl Drop for ConfigMapVolume {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}
