#[redguard::dist_lock(key = "catalog:{id}", read, write)]
async fn both(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

#[redguard::dist_lock(key = "catalog:{id}", read, permits = 2)]
async fn read_semaphore(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

#[redguard::dist_lock(key = "catalog:{id}", write, hold_at_least = "1s")]
async fn write_kept(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

#[redguard::dist_lock(key = "catalog:{id}", fair, permits = 2)]
async fn fair_semaphore(id: u64) -> Result<(), redguard::Error> {
    let _ = id;
    Ok(())
}

fn main() {}
