// Every misuse of `#[derive(Classify)]` is reported, each where it was written.
#[derive(redguard::Classify)]
enum Unknown {
    #[classify(maybe)]
    A,
    #[classify(business, indeterminate)]
    B,
}

#[derive(redguard::Classify)]
enum DelegateWithoutOneField {
    #[classify(delegate)]
    A(u8, u8),
    #[classify(delegate)]
    B,
}

#[derive(redguard::Classify)]
#[classify(delegate)]
enum DelegateOnEnum {
    A,
}

#[derive(redguard::Classify)]
union NotAnError {
    a: u8,
}

#[derive(Debug, redguard::Classify)]
#[classify(from)]
enum FromOnEnum {
    Guard(redguard::Error),
}

#[derive(Debug, redguard::Classify)]
enum FromTwice {
    #[classify(from)]
    A(redguard::Error),
    #[classify(from)]
    B(redguard::Error),
}

#[derive(Debug, redguard::Classify)]
enum FromWithoutOneField {
    #[classify(from)]
    A,
}

fn main() {}
