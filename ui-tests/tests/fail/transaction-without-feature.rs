// `.transaction(tx)` without redguard's feature `sqlx`: one error naming the feature.
struct Tx;

async fn place(order: u64, tx: Tx) -> redguard::Result<u64> {
    redguard::idempotency(redguard::key("order:{id}").part("id", &order))
        .transaction(tx)
        .run(async |tx| (tx, Ok(order)))
        .await
}

fn main() {
    let _ = place;
}
