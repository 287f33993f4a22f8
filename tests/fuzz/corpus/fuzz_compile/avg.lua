return (inputs.a + inputs.b) / 2
