//! `make docs`: rewrites the generated regions of the docs (see `ck8s_certs_e2e::docsgen`) and
//! names the files it changed.

use std::path::Path;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    for (path, committed, generated) in ck8s_certs_e2e::docsgen::generated_docs(&root)? {
        if committed != generated {
            std::fs::write(&path, generated)?;
            println!("wrote {}", path.display());
        }
    }
    Ok(())
}
