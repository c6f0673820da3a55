struct Request {
    id: Vec<u8>,
}

#[redguard::idempotent(key = "order:{req.id}", expire = 600)]
async fn submit(req: Request) -> Result<(), redguard::Error> {
    let _ = req;
    Ok(())
}

fn main() {}
