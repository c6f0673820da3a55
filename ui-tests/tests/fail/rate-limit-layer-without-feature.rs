// `RateLimitLayer` without redguard's feature `tower`: one error naming the feature (not
// `http` first, then `tower`).
use redguard::http::RateLimitLayer;

fn main() {
    let _ = std::any::type_name::<RateLimitLayer>();
}
