//! The dense-weight projection made before loading (and used to refuse a model that cannot
//! fit) agrees with what the loaded model really holds.

use std::path::PathBuf;
use std::sync::Arc;

use colibri::config::ModelConfig;
use colibri::engine::projected_dense_bytes;
use colibri::model::{LoadOptions, Model};
use colibri::quant::QFormat;
use colibri::weights::ShardSet;

#[test]
fn projection_matches_the_loaded_dense_weights() {
    for model in ["tiny-dense-shared", "tiny-moe-bias"] {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../tests/fixtures")
            .join(model);
        for fmt in [QFormat::F32, QFormat::I8Row, QFormat::I4G64] {
            let opts = LoadOptions {
                dense_fmt: fmt,
                ..LoadOptions::default()
            };
            let shards = Arc::new(ShardSet::open(std::slice::from_ref(&dir)).unwrap());
            let projected = projected_dense_bytes(&shards, &opts) as f64;
            let cfg = ModelConfig::load(&dir).unwrap();
            let loaded = Model::load(cfg, shards, opts).unwrap().dense_bytes() as f64;
            // The projection also counts the per-layer norms and the router bias, which
            // `dense_bytes` leaves out: within a few percent on these tiny models.
            let ratio = projected / loaded;
            assert!(
                (0.97..=1.03).contains(&ratio),
                "{model} {}: projected {projected} loaded {loaded}",
                fmt.name()
            );
        }
    }
}
