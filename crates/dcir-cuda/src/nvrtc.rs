//! Compiling kernels to PTX with NVRTC (no GPU needed), with ptxas's
//! resource report.
//!
//! The NVRTC library is loaded at run time; [`available`] probes for it
//! first, so a machine without it gets an error, never a panic. Tests print
//! `SKIP: <reason>` when it is missing, unless `DCIR_REQUIRE_NVRTC=1`.
//!
//! Compiling for a real architecture (`sm_90`) makes NVRTC run ptxas too;
//! with `--ptxas-options=-v` ptxas writes the registers, shared memory,
//! stack frame and spills of every kernel to the program log, which
//! [`compile`] parses into [`Resources`]. cudarc's safe API returns the log
//! only on failure, so this module drives NVRTC's C API through cudarc's
//! thin `result` wrappers.
//!
//! With a cache directory set ([`set_cache_dir`]; the drivers take
//! [`default_cache_dir`]), [`compile`] keeps each program's PTX, CUBIN and
//! log there under a hash of the NVRTC version, architecture, options, name
//! and source, and a later compilation of the same program reads them back
//! instead of running NVRTC. An entry holds its full key text and is used only
//! when that matches; files are written under temporary names and renamed, the
//! PTX last, so a reader never sees half an entry. Delete the directory to
//! clear it.

use std::ffi::{CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::RwLock;

use cudarc::nvrtc::result;

/// The default target architecture.
pub const DEFAULT_ARCH: &str = "sm_90";

/// Whether the NVRTC library can be loaded.
pub fn available() -> bool {
    // SAFETY: the probe only tries to dlopen the library by its candidate
    // names and drops it; it calls no NVRTC function.
    #[allow(unsafe_code)]
    unsafe {
        cudarc::nvrtc::sys::is_culib_present()
    }
}

/// Why NVRTC is unusable here, or `None` when it is available.
pub fn unavailable_reason() -> Option<String> {
    if available() {
        None
    } else {
        Some(
            "libnvrtc not found (pip install nvidia-cuda-nvrtc==13.0.88 and put \
             site-packages/nvidia/cu13/lib on LD_LIBRARY_PATH)"
                .to_string(),
        )
    }
}

/// NVRTC's version (major, minor), or `None` when it is unavailable.
pub fn version() -> Option<(i32, i32)> {
    if !available() {
        return None;
    }
    let (mut major, mut minor) = (0, 0);
    // SAFETY: the library is present; the call writes two ints.
    #[allow(unsafe_code)]
    let status = unsafe { cudarc::nvrtc::sys::nvrtcVersion(&mut major, &mut minor) };
    (status == cudarc::nvrtc::sys::nvrtcResult::NVRTC_SUCCESS).then_some((major, minor))
}

/// The compute capabilities NVRTC compiles for (`[75, 80, ..., 120]`),
/// or `None` when it is unavailable.
pub fn supported_archs() -> Option<Vec<i32>> {
    if !available() {
        return None;
    }
    let mut count = 0;
    // SAFETY: the library is present; the first call writes one int, the
    // second `count` ints into a buffer of that length.
    #[allow(unsafe_code)]
    unsafe {
        use cudarc::nvrtc::sys::{self, nvrtcResult::NVRTC_SUCCESS};
        if sys::nvrtcGetNumSupportedArchs(&mut count) != NVRTC_SUCCESS || count <= 0 {
            return None;
        }
        let mut archs = vec![0; count as usize];
        (sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) == NVRTC_SUCCESS).then_some(archs)
    }
}

/// Checks an architecture name (`sm_90`, `sm_90a`, `compute_80`) and, when
/// NVRTC is available, that it can compile for it: a clear error naming
/// what it supports otherwise.
pub fn check_arch(arch: &str) -> Result<(), String> {
    let digits = arch
        .strip_prefix("sm_")
        .or_else(|| arch.strip_prefix("compute_"))
        .map(|rest| rest.trim_end_matches(['a', 'f']))
        .and_then(|d| d.parse::<i32>().ok())
        .ok_or_else(|| {
            format!("`{arch}` is not a GPU architecture (sm_XY or compute_XY, e.g. sm_90)")
        })?;
    let Some(archs) = supported_archs() else {
        return Ok(());
    };
    if archs.contains(&digits) {
        return Ok(());
    }
    let listed: Vec<String> = archs.iter().map(|a| format!("sm_{a}")).collect();
    let version = version().map_or(String::new(), |(major, minor)| format!(" {major}.{minor}"));
    Err(format!(
        "NVRTC{version} cannot compile for `{arch}`; it supports {}",
        listed.join(", ")
    ))
}

/// What ptxas reported for one kernel.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    /// Registers per thread.
    pub registers: u32,
    /// Bytes of static shared memory.
    pub shared_bytes: u32,
    /// Bytes of per-thread stack frame (local memory).
    pub stack_frame: u32,
    /// Bytes of register spill stores.
    pub spill_stores: u32,
    /// Bytes of register spill loads.
    pub spill_loads: u32,
}

impl Resources {
    /// Why these resources break the kernel's contract for `threads` per
    /// block, or `None`: any spill or stack frame (local-memory traffic), or
    /// more registers than `threads` leaves each thread (65536 per SM, at
    /// most 255).
    pub fn violation(&self, threads: u32) -> Option<String> {
        let budget = (65536 / threads.max(1)).min(255);
        if self.spill_stores > 0 || self.spill_loads > 0 {
            Some(format!(
                "{} bytes spill stores, {} bytes spill loads",
                self.spill_stores, self.spill_loads
            ))
        } else if self.stack_frame > 0 {
            Some(format!("{} bytes stack frame", self.stack_frame))
        } else if self.registers > budget {
            Some(format!(
                "{} registers per thread, more than the {budget} a block of {threads} threads allows",
                self.registers
            ))
        } else {
            None
        }
    }
}

impl std::fmt::Display for Resources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} registers, {} bytes smem, {} bytes stack, {} bytes spill stores, {} bytes spill loads",
            self.registers,
            self.shared_bytes,
            self.stack_frame,
            self.spill_stores,
            self.spill_loads
        )
    }
}

/// The output of one NVRTC compilation.
#[derive(Clone, Debug)]
pub struct Compiled {
    /// The PTX text.
    pub ptx: String,
    /// Machine code (CUBIN) when the target is a real architecture
    /// (`sm_90`): it loads without the driver compiling the PTX.
    pub cubin: Option<Vec<u8>>,
    /// ptxas's report for the kernel, when the log held one.
    pub resources: Option<Resources>,
    /// NVRTC's program log (warnings and ptxas's `info` lines).
    pub log: String,
}

/// Where [`compile`] keeps its outputs between runs; `None` (the default
/// for library users): nowhere.
static CACHE_DIR: RwLock<Option<PathBuf>> = RwLock::new(None);

/// Sets (or, with `None`, turns off) the directory [`compile`] caches in.
pub fn set_cache_dir(dir: Option<PathBuf>) {
    *CACHE_DIR.write().unwrap_or_else(|e| e.into_inner()) = dir;
}

/// The directory [`compile`] caches in, if any.
pub fn cache_dir() -> Option<PathBuf> {
    CACHE_DIR.read().unwrap_or_else(|e| e.into_inner()).clone()
}

/// The drivers' cache directory: `$DCIR_NVRTC_CACHE` (`none` turns the
/// cache off), else `~/.cache/dcir/nvrtc`, else none.
pub fn default_cache_dir() -> Option<PathBuf> {
    match std::env::var_os("DCIR_NVRTC_CACHE") {
        Some(v) if v == "none" => None,
        Some(v) => Some(PathBuf::from(v)),
        None => std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/dcir/nvrtc")),
    }
}

/// The files of one cache entry, by extension.
fn entry(dir: &Path, hash: &str, ext: &str) -> PathBuf {
    dir.join(format!("{hash}.{ext}"))
}

/// The cached compilation whose key text is `key`, if a whole entry is there.
fn cached(dir: &Path, hash: &str, key: &str) -> Option<Compiled> {
    let ptx = std::fs::read_to_string(entry(dir, hash, "ptx")).ok()?;
    if std::fs::read_to_string(entry(dir, hash, "key")).ok()? != key {
        return None;
    }
    let log = std::fs::read_to_string(entry(dir, hash, "log")).ok()?;
    Some(Compiled {
        ptx,
        cubin: std::fs::read(entry(dir, hash, "cubin")).ok(),
        resources: parse_resources(&log),
        log,
    })
}

/// Stores `compiled` under `hash` (best effort: a cache that cannot be
/// written is no error). Each file goes under a temporary name first; the
/// PTX, which marks a whole entry, last.
fn store(dir: &Path, hash: &str, key: &str, compiled: &Compiled) {
    let write = |ext: &str, bytes: &[u8]| -> std::io::Result<()> {
        let to = entry(dir, hash, ext);
        // Unique per process and call: threads may store the same entry.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(".{hash}.{ext}.{}.{n}", std::process::id()));
        std::fs::write(&tmp, bytes)?;
        std::fs::rename(&tmp, &to)
    };
    let _ = (|| -> std::io::Result<()> {
        std::fs::create_dir_all(dir)?;
        write("key", key.as_bytes())?;
        write("log", compiled.log.as_bytes())?;
        if let Some(cubin) = &compiled.cubin {
            write("cubin", cubin)?;
        }
        write("ptx", compiled.ptx.as_bytes())
    })();
}

/// 128 bits of FNV-1a over `text` (two 64-bit streams), as hex.
fn hash_hex(text: &str) -> String {
    let fnv = |basis: u64| {
        text.bytes().fold(basis, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01B3)
        })
    };
    format!(
        "{:016x}{:016x}",
        fnv(0xCBF2_9CE4_8422_2325),
        fnv(0x6C62_272E_07BB_0142)
    )
}

/// Compiles one translation unit to PTX for `arch` (`sm_90` by default) and
/// reads ptxas's resource report of its kernel from the log; from the cache
/// directory when it holds this program (see the module doc).
pub fn compile(source: &str, name: &str, arch: &str) -> Result<Compiled, String> {
    if let Some(reason) = unavailable_reason() {
        return Err(reason);
    }
    let options = options(arch);
    let cache = cache_dir();
    let (key, hash) = cache_key(source, name, &options);
    if let Some(hit) = cache.as_deref().and_then(|dir| cached(dir, &hash, &key)) {
        return Ok(hit);
    }
    let compiled = compile_now(source, name, &options)?;
    if let Some(dir) = &cache {
        store(dir, &hash, &key, &compiled);
    }
    Ok(compiled)
}

/// NVRTC's options for `arch`.
fn options(arch: &str) -> [String; 3] {
    [
        format!("--gpu-architecture={arch}"),
        "--std=c++17".to_string(),
        "--ptxas-options=-v".to_string(),
    ]
}

/// A program's cache key text (NVRTC version, options, name, source) and its hash.
fn cache_key(source: &str, name: &str, options: &[String]) -> (String, String) {
    let key = format!(
        "nvrtc {:?}\n{}\n{name}\n{source}",
        version(),
        options.join(" ")
    );
    let hash = hash_hex(&key);
    (key, hash)
}

/// Runs NVRTC on one translation unit with `options`.
fn compile_now(source: &str, name: &str, options: &[String]) -> Result<Compiled, String> {
    let src = CString::new(source).map_err(|_| "the source contains a NUL byte".to_string())?;
    let file = CString::new(format!("{name}.cu")).map_err(|_| "NUL byte in the kernel name")?;
    let program =
        result::create_program(&src, Some(&file)).map_err(|e| format!("NVRTC on {name}: {e}"))?;
    // SAFETY: `program` was just created and is destroyed exactly once below,
    // after its last use; `src` and `file` outlive it.
    #[allow(unsafe_code)]
    let (compiled, log, ptx, cubin) = unsafe {
        let compiled = result::compile_program(program, options);
        let log = result::get_program_log(program).map(|l| c_text(&l));
        let (ptx, cubin) = match compiled {
            Ok(()) => (
                Some(result::get_ptx(program).map(|p| c_text(&p))),
                get_cubin(program),
            ),
            Err(_) => (None, None),
        };
        let _ = result::destroy_program(program);
        (compiled, log, ptx, cubin)
    };
    let log = log.unwrap_or_default();
    if compiled.is_err() {
        return Err(format!("NVRTC failed on {name}:\n{log}"));
    }
    let ptx = ptx
        .expect("compiled")
        .map_err(|e| format!("NVRTC on {name}: no PTX: {e}"))?;
    Ok(Compiled {
        ptx,
        cubin,
        resources: parse_resources(&log),
        log,
    })
}

/// Compiles many kernels as one NVRTC program (each source in a namespace
/// of its own, so their helpers do not collide) and returns ptxas's report
/// for each, in order: one program's fixed cost instead of one per kernel,
/// for checking many kernels (the zoo test). `kernels` holds each kernel's
/// entry-point name and header-free source; the names must differ.
pub fn compile_batch(kernels: &[(&str, &str)], arch: &str) -> Result<Vec<Resources>, String> {
    let mut source = String::new();
    for (i, (_, text)) in kernels.iter().enumerate() {
        source.push_str(&format!("namespace dcir_batch_{i} {{\n{text}\n}}\n"));
    }
    let first = kernels.first().map_or("batch", |k| k.0);
    let compiled = compile(&source, &format!("{first}_batch"), arch)?;
    // ptxas reports each entry point under `Compiling entry function 'name'`.
    let mut sections: std::collections::HashMap<&str, &str> = std::collections::HashMap::new();
    let marker = "Compiling entry function '";
    let mut rest = compiled.log.as_str();
    while let Some(at) = rest.find(marker) {
        let after = &rest[at + marker.len()..];
        let name_end = after.find('\'').unwrap_or(after.len());
        let next = after.find(marker).unwrap_or(after.len());
        sections.insert(&after[..name_end], &after[..next]);
        rest = &after[next..];
    }
    kernels
        .iter()
        .map(|(name, _)| {
            sections
                .get(name)
                .and_then(|section| parse_resources(section))
                .ok_or_else(|| {
                    format!("no ptxas report for {name} in its batch:\n{}", compiled.log)
                })
        })
        .collect()
}

/// The program's CUBIN, if NVRTC made one (a real target architecture).
///
/// # Safety
///
/// `program` must be a live, successfully compiled NVRTC program.
#[allow(unsafe_code)]
unsafe fn get_cubin(program: cudarc::nvrtc::sys::nvrtcProgram) -> Option<Vec<u8>> {
    use cudarc::nvrtc::sys::{nvrtcGetCUBIN, nvrtcGetCUBINSize, nvrtcResult};
    let mut size = 0usize;
    // SAFETY: the caller's contract; NVRTC writes the size, then `size` bytes.
    if unsafe { nvrtcGetCUBINSize(program, &mut size) } != nvrtcResult::NVRTC_SUCCESS || size == 0 {
        return None;
    }
    let mut bytes = vec![0u8; size];
    let status = unsafe { nvrtcGetCUBIN(program, bytes.as_mut_ptr().cast()) };
    (status == nvrtcResult::NVRTC_SUCCESS).then_some(bytes)
}

/// The text of a NUL-terminated buffer NVRTC filled.
fn c_text(buf: &[std::ffi::c_char]) -> String {
    let bytes: Vec<u8> = buf.iter().map(|&c| c as u8).collect();
    CStr::from_bytes_until_nul(&bytes)
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).into_owned())
}

/// Reads ptxas's `info` lines (one kernel per program):
///
/// ```text
/// ptxas info    : Function properties for k
///     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
/// ptxas info    : Used 32 registers, used 1 barriers, 8192 bytes smem, 380 bytes cmem[0]
/// ```
fn parse_resources(log: &str) -> Option<Resources> {
    let mut r = Resources::default();
    let mut seen = false;
    for line in log.lines() {
        for part in line.split([',', ':']) {
            let words: Vec<&str> = part.split_whitespace().collect();
            let number = |i: usize| words.get(i).and_then(|w| w.parse::<u32>().ok());
            match words.as_slice() {
                ["Used", _, "registers"] => {
                    r.registers = number(1)?;
                    seen = true;
                }
                [_, "bytes", "smem"] => r.shared_bytes = number(0)?,
                [_, "bytes", "stack", "frame"] => r.stack_frame = number(0)?,
                [_, "bytes", "spill", "stores"] => r.spill_stores = number(0)?,
                [_, "bytes", "spill", "loads"] => r.spill_loads = number(0)?,
                _ => {}
            }
        }
    }
    seen.then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_ptxas_report() {
        let log = "ptxas info    : 0 bytes gmem\n\
                   ptxas info    : Compiling entry function 'k' for 'sm_90'\n\
                   ptxas info    : Function properties for k\n\
                   \x20   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
                   ptxas info    : Used 40 registers, used 1 barriers, 8192 bytes smem, 380 bytes cmem[0]\n";
        let r = parse_resources(log).expect("a report");
        assert_eq!(
            r,
            Resources {
                registers: 40,
                shared_bytes: 8192,
                stack_frame: 8,
                spill_stores: 4,
                spill_loads: 12,
            }
        );
        assert!(r.violation(256).unwrap().contains("spill"));
        assert_eq!(parse_resources("no report"), None);
    }

    #[test]
    fn register_budget_follows_the_block_size() {
        let r = Resources {
            registers: 128,
            ..Resources::default()
        };
        assert_eq!(r.violation(512), None);
        assert!(r.violation(1024).unwrap().contains("64"));
    }

    #[test]
    fn a_cached_program_is_read_back_and_a_changed_one_recompiled() {
        if unavailable_reason().is_some() {
            println!(
                "SKIP: NVRTC cache: {}",
                unavailable_reason().unwrap_or_default()
            );
            return;
        }
        let dir = std::env::temp_dir().join(format!("dcir-nvrtc-cache-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        set_cache_dir(Some(dir.clone()));
        let src =
            "extern \"C\" __global__ void cache_probe(float* x) { x[threadIdx.x] += 1.0f; }\n";
        let first = compile(src, "cache_probe", DEFAULT_ARCH).expect("compiles");
        // Other tests compile beside this one: find this program's entry by its key.
        let (_, hash) = cache_key(src, "cache_probe", &options(DEFAULT_ARCH));
        assert!(entry(&dir, &hash, "ptx").exists());
        // A log that says 99 registers comes back: the second compile read the cache.
        let marker = "ptxas info    : Used 99 registers, 0 bytes smem\n";
        std::fs::write(entry(&dir, &hash, "log"), marker).expect("edits");
        let second = compile(src, "cache_probe", DEFAULT_ARCH).expect("a hit");
        assert_eq!(second.resources.map(|r| r.registers), Some(99));
        assert_eq!((second.ptx, second.cubin), (first.ptx, first.cubin));
        // An entry whose key text differs (a hash collision, an edit) is compiled again.
        std::fs::write(entry(&dir, &hash, "key"), "another program").expect("edits");
        let third = compile(src, "cache_probe", DEFAULT_ARCH).expect("compiles");
        assert_ne!(third.resources.map(|r| r.registers), Some(99));
        set_cache_dir(None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn compiles_and_reports_when_nvrtc_is_present() {
        if let Some(reason) = unavailable_reason() {
            if std::env::var("DCIR_REQUIRE_NVRTC").is_ok_and(|v| v == "1") {
                panic!("DCIR_REQUIRE_NVRTC=1 but {reason}");
            }
            println!("SKIP: {reason}");
            return;
        }
        let src = "extern \"C\" __global__ void k(float* x) { x[threadIdx.x] *= 2.0f; }\n";
        let c = compile(src, "k", DEFAULT_ARCH).expect("compiles");
        assert!(c.ptx.contains(".entry k"), "{}", c.ptx);
        let r = c.resources.expect("ptxas report");
        assert!(r.registers > 0 && r.violation(1024).is_none(), "{r}");
        // A real architecture also gives machine code (an ELF image); a
        // virtual one only PTX.
        assert!(c.cubin.as_ref().is_some_and(|b| b.starts_with(b"\x7fELF")));
        assert!(
            compile(src, "k", "compute_90")
                .expect("compiles")
                .cubin
                .is_none()
        );
        assert_eq!(version().map(|(major, _)| major), Some(13));
        let err = compile("this is not C", "bad", DEFAULT_ARCH).unwrap_err();
        assert!(err.contains("NVRTC failed on bad"), "{err}");
        // A batch: the same helper in both sources, one report per kernel.
        let a = "__device__ __forceinline__ float h(float x) { return x * 2.0f; }\n\
                 extern \"C\" __global__ void a(float* x) { x[threadIdx.x] = h(x[threadIdx.x]); }\n";
        let b = "__device__ __forceinline__ float h(float x) { return x + 1.0f; }\n\
                 extern \"C\" __global__ void b(float* x, float* y) { y[threadIdx.x] = h(x[threadIdx.x]); }\n";
        let reports = compile_batch(&[("a", a), ("b", b)], DEFAULT_ARCH).expect("compiles");
        assert_eq!(reports.len(), 2);
        assert!(reports.iter().all(|r| r.registers > 0), "{reports:?}");
    }
}
