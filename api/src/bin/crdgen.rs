//! Writes the CRDs of this crate as YAML into the folder given as the only argument
//! (`make manifests` uses `config/crd/bases`), or prints them when none is given.

use std::path::PathBuf;

use ck8s_certs_api::crds;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = std::env::args().nth(1).map(PathBuf::from);
    for (file, yaml) in crds::all()? {
        match &out {
            Some(dir) => std::fs::write(dir.join(file), yaml)?,
            None => print!("---\n{yaml}"),
        }
    }
    Ok(())
}
